#ifndef TANDEM_KERNELS_CUDA_CUBLAS_REFERENCE_H_
#define TANDEM_KERNELS_CUDA_CUBLAS_REFERENCE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/device.h"

namespace tandem::cuda {

// cuBLAS as the yardstick of the benchmarks, loaded at run time (libcublas.so.13, else .so.12):
// the device machine has cuBLAS only inside PyTorch's wheels, whose major version we cannot
// know at build time, and the kernels themselves do not use it.
class CublasReference {
 public:
  // NOT_FOUND naming the libraries tried when none loads (set LD_LIBRARY_PATH).
  static absl::StatusOr<std::unique_ptr<CublasReference>> Load();
  ~CublasReference();

  // Row-major c[m, n] = a[m, k] · bᵀ where b is [n, k] (x · Wᵀ): fp32 sgemm on the default
  // stream.
  absl::Status MatmulTransposed(const float* a, const float* b, float* c, int m, int n, int k);
  // The same product on the tensor cores: a and b hold bf16 (as uint16_t bits), c fp32, fp32
  // accumulation (cublasGemmEx, CUBLAS_COMPUTE_32F).
  absl::Status MatmulTransposedBf16(const uint16_t* a, const uint16_t* b, float* c, int m, int n,
                                    int k);
  // One such product per group in one call (cublasGemmGroupedBatchedEx): group g multiplies
  // rows[g] rows of a[g] by b[g]ᵀ into c[g], here bf16 too (cuBLAS 13 refuses fp32 output of
  // bf16 inputs in a grouped call as NOT_SUPPORTED); a, b and c are device arrays of one device
  // pointer per group, all groups n wide and k deep. UNIMPLEMENTED where the loaded cuBLAS lacks
  // it (before 12.5).
  absl::Status GroupedMatmulTransposedBf16(const std::vector<int>& rows, int n, int k,
                                           const uint16_t* const* a, const uint16_t* const* b,
                                           uint16_t* const* c);

 private:
  struct Api;
  explicit CublasReference(std::unique_ptr<Api> api);
  std::unique_ptr<Api> api_;
};

}  // namespace tandem::cuda

#endif  // TANDEM_KERNELS_CUDA_CUBLAS_REFERENCE_H_
