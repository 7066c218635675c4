#ifndef TANDEM_KERNELS_CUDA_ELEMENTWISE_H_
#define TANDEM_KERNELS_CUDA_ELEMENTWISE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/device.h"

namespace tandem::cuda {

// y[i] += x[i] for i < n (residual connections); device memory.
absl::Status AddInPlace(const float* x, float* y, int64_t n, Stream stream = nullptr);

// y[i] *= factor for i < n (e.g. routed_scaling_factor on gate weights); device memory.
absl::Status ScaleInPlace(float* y, float factor, int64_t n, Stream stream = nullptr);

// x[i] <- x[i] rounded to bfloat16 (to nearest, ties to even; NaN stays NaN), as a float: the
// bf16 inference mode's rounding of activations, bit for bit common/dtype.h's ToBFloat16.
absl::Status RoundToBf16(float* x, int64_t n, Stream stream = nullptr);

}  // namespace tandem::cuda

#endif  // TANDEM_KERNELS_CUDA_ELEMENTWISE_H_
