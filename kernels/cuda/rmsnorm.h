#ifndef TANDEM_KERNELS_CUDA_RMSNORM_H_
#define TANDEM_KERNELS_CUDA_RMSNORM_H_

#include "absl/status/status.h"
#include "kernels/cuda/device.h"

namespace tandem::cuda {

// Device twins of kernels/cpu/rmsnorm.h, same contracts: rstd may be null in the forward; the
// backward accumulates into dx and dweight, either of which may be null.
absl::Status RmsNorm(const float* x, const float* weight, float* y, float* rstd, int rows, int dim,
                     float eps, Stream stream = nullptr);
absl::Status RmsNormBackward(const float* x, const float* weight, const float* rstd,
                             const float* dy, float* dx, float* dweight, int rows, int dim,
                             Stream stream = nullptr);

}  // namespace tandem::cuda

#endif  // TANDEM_KERNELS_CUDA_RMSNORM_H_
