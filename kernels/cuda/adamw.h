#ifndef TANDEM_KERNELS_CUDA_ADAMW_H_
#define TANDEM_KERNELS_CUDA_ADAMW_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cuda/device.h"

namespace tandem::cuda {

// Device twin of cpu::AdamWUpdate (same step constants, same element formula); device pointers.
// Call it as cuda::AdamWUpdate: the cpu::AdamWStep argument makes lookup find the CPU twin too.
absl::Status AdamWUpdate(float* value, const float* grad, float* exp_avg, float* exp_avg_sq,
                         int64_t n, bool decay, const cpu::AdamWStep& step,
                         Stream stream = nullptr);

}  // namespace tandem::cuda

#endif  // TANDEM_KERNELS_CUDA_ADAMW_H_
