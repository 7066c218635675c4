#ifndef TANDEM_KERNELS_CUDA_SWIGLU_H_
#define TANDEM_KERNELS_CUDA_SWIGLU_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/device.h"

namespace tandem::cuda {

// Device twins of kernels/cpu/swiglu.h, same contracts (the backward accumulates; a null
// gradient output is skipped). All pointers are device memory.
absl::Status SwiGlu(const float* gate, const float* up, float* out, int64_t n,
                    Stream stream = nullptr);
absl::Status SwiGluBackward(const float* gate, const float* up, const float* dout, float* dgate,
                            float* dup, int64_t n, Stream stream = nullptr);

}  // namespace tandem::cuda

#endif  // TANDEM_KERNELS_CUDA_SWIGLU_H_
