#include "kernels/cuda/cublas_reference.h"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"

namespace tandem::cuda {
namespace {

// The slice of cuBLAS's stable C API the benchmarks use; enum values from cublas_api.h.
using Handle = void*;
using CreateFn = int (*)(Handle*);
using DestroyFn = int (*)(Handle);
using SgemmFn = int (*)(Handle, int, int, int, int, int, const float*, const float*, int,
                        const float*, int, const float*, float*, int);
using GemmExFn = int (*)(Handle, int, int, int, int, int, const void*, const void*, int, int,
                         const void*, int, int, const void*, void*, int, int, int, int);
using GroupedGemmExFn = int (*)(Handle, const int*, const int*, const int*, const int*, const int*,
                                const void*, const void* const*, int, const int*,
                                const void* const*, int, const int*, const void*, void* const*, int,
                                const int*, int, const int*, int);
constexpr int kNoTranspose = 0;  // CUBLAS_OP_N
constexpr int kTranspose = 1;    // CUBLAS_OP_T
constexpr int kFloat32 = 0;      // CUDA_R_32F
constexpr int kBFloat16 = 14;    // CUDA_R_16BF
constexpr int kCompute32F = 68;  // CUBLAS_COMPUTE_32F
constexpr int kDefaultAlgorithm = -1;  // CUBLAS_GEMM_DEFAULT

}  // namespace

struct CublasReference::Api {
  void* library = nullptr;
  Handle handle = nullptr;
  DestroyFn destroy = nullptr;
  SgemmFn sgemm = nullptr;
  GemmExFn gemm_ex = nullptr;
  GroupedGemmExFn grouped_gemm_ex = nullptr;  // Null before cuBLAS 12.5.
  ~Api() {
    if (handle != nullptr) destroy(handle);
    if (library != nullptr) dlclose(library);
  }
};

absl::StatusOr<std::unique_ptr<CublasReference>> CublasReference::Load() {
  auto api = std::make_unique<Api>();
  for (const char* name : {"libcublas.so.13", "libcublas.so.12"}) {
    api->library = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (api->library != nullptr) break;
  }
  if (api->library == nullptr) {
    return absl::NotFoundError("cuBLAS not found (tried libcublas.so.13 and .so.12)");
  }
  const auto create = reinterpret_cast<CreateFn>(dlsym(api->library, "cublasCreate_v2"));
  api->destroy = reinterpret_cast<DestroyFn>(dlsym(api->library, "cublasDestroy_v2"));
  api->sgemm = reinterpret_cast<SgemmFn>(dlsym(api->library, "cublasSgemm_v2"));
  api->gemm_ex = reinterpret_cast<GemmExFn>(dlsym(api->library, "cublasGemmEx"));
  api->grouped_gemm_ex =
      reinterpret_cast<GroupedGemmExFn>(dlsym(api->library, "cublasGemmGroupedBatchedEx"));
  if (create == nullptr || api->destroy == nullptr || api->sgemm == nullptr ||
      api->gemm_ex == nullptr) {
    return absl::NotFoundError(
        "cuBLAS library lacks cublasCreate_v2, cublasSgemm_v2 or cublasGemmEx");
  }
  if (const int error = create(&api->handle); error != 0) {
    api->handle = nullptr;
    return absl::InternalError(absl::StrCat("cublasCreate failed with status ", error));
  }
  return std::unique_ptr<CublasReference>(new CublasReference(std::move(api)));
}

CublasReference::CublasReference(std::unique_ptr<Api> api) : api_(std::move(api)) {}
CublasReference::~CublasReference() = default;

// cuBLAS is column-major: row-major C = A · Bᵀ is column-major Cᵀ = B · Aᵀ, i.e.
// sgemm(op(B) = T on the [k, n] column-major view of b, A as [k, m]).
absl::Status CublasReference::MatmulTransposed(const float* a, const float* b, float* c, int m,
                                               int n, int k) {
  const float one = 1.0f, zero = 0.0f;
  const int error =
      api_->sgemm(api_->handle, kTranspose, kNoTranspose, n, m, k, &one, b, k, a, k, &zero, c, n);
  if (error != 0) return absl::InternalError(absl::StrCat("cublasSgemm failed: ", error));
  return absl::OkStatus();
}

absl::Status CublasReference::MatmulTransposedBf16(const uint16_t* a, const uint16_t* b, float* c,
                                                   int m, int n, int k) {
  const float one = 1.0f, zero = 0.0f;
  const int error =
      api_->gemm_ex(api_->handle, kTranspose, kNoTranspose, n, m, k, &one, b, kBFloat16, k, a,
                    kBFloat16, k, &zero, c, kFloat32, n, kCompute32F, kDefaultAlgorithm);
  if (error != 0) return absl::InternalError(absl::StrCat("cublasGemmEx failed: ", error));
  return absl::OkStatus();
}

// Each group is a problem of its own shape (group_size 1), transposed as in MatmulTransposed.
absl::Status CublasReference::GroupedMatmulTransposedBf16(const std::vector<int>& rows, int n,
                                                          int k, const uint16_t* const* a,
                                                          const uint16_t* const* b,
                                                          uint16_t* const* c) {
  if (api_->grouped_gemm_ex == nullptr) {
    return absl::UnimplementedError("cuBLAS lacks cublasGemmGroupedBatchedEx (needs 12.5)");
  }
  const int groups = static_cast<int>(rows.size());
  const std::vector<int> transpose(groups, kTranspose), no_transpose(groups, kNoTranspose);
  const std::vector<int> widths(groups, n), depths(groups, k), ones(groups, 1);
  const std::vector<float> alphas(groups, 1.0f), betas(groups, 0.0f);
  const int error = api_->grouped_gemm_ex(
      api_->handle, transpose.data(), no_transpose.data(), widths.data(), rows.data(),
      depths.data(), alphas.data(), reinterpret_cast<const void* const*>(b), kBFloat16,
      depths.data(), reinterpret_cast<const void* const*>(a), kBFloat16, depths.data(),
      betas.data(), reinterpret_cast<void* const*>(c), kBFloat16, widths.data(), groups,
      ones.data(), kCompute32F);
  if (error != 0) {
    return absl::InternalError(absl::StrCat("cublasGemmGroupedBatchedEx failed: ", error));
  }
  return absl::OkStatus();
}

}  // namespace tandem::cuda
