#include "kernels/cuda/adamw.h"
#include "kernels/cuda/launch.cuh"

namespace tandem::cuda {
namespace {

__global__ void AdamWKernel(float* __restrict__ value, const float* __restrict__ grad,
                            float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq, int64_t n,
                            bool decay, cpu::AdamWStep step) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = grad[i];
    float p = value[i];
    if (decay) p *= step.decay_factor;
    const float m = step.beta1 * exp_avg[i] + (1.0f - step.beta1) * g;
    const float v = step.beta2 * exp_avg_sq[i] + (1.0f - step.beta2) * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    value[i] = p - step.step_size * m / (sqrtf(v) / step.bias_correction2_sqrt + step.eps);
  }
}

}  // namespace

absl::Status AdamWUpdate(float* value, const float* grad, float* exp_avg, float* exp_avg_sq,
                         int64_t n, bool decay, const cpu::AdamWStep& step, Stream stream) {
  if (n == 0) return absl::OkStatus();
  AdamWKernel<<<GridFor(n), kThreadsPerBlock, 0, stream>>>(value, grad, exp_avg, exp_avg_sq, n,
                                                           decay, step);
  return LaunchStatus("AdamWUpdate");
}

}  // namespace tandem::cuda
