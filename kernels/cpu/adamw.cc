#include "kernels/cpu/adamw.h"

#include <cmath>

namespace tandem::cpu {

AdamWStep AdamWStep::For(float lr, int64_t t, float beta1, float beta2, float eps,
                         float weight_decay) {
  const double steps = static_cast<double>(t);
  return AdamWStep{
      .step_size = static_cast<float>(lr / (1.0 - std::pow(beta1, steps))),
      .bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(beta2, steps))),
      .decay_factor = 1.0f - lr * weight_decay,
      .beta1 = beta1,
      .beta2 = beta2,
      .eps = eps,
  };
}

void AdamWUpdate(float* value, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                 bool decay, const AdamWStep& step) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    if (decay) value[i] *= step.decay_factor;
    exp_avg[i] = step.beta1 * exp_avg[i] + (1.0f - step.beta1) * g;
    exp_avg_sq[i] = step.beta2 * exp_avg_sq[i] + (1.0f - step.beta2) * g * g;
    const float denom = std::sqrt(exp_avg_sq[i]) / step.bias_correction2_sqrt + step.eps;
    value[i] -= step.step_size * exp_avg[i] / denom;
  }
}

}  // namespace tandem::cpu
