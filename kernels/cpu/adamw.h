#ifndef TANDEM_KERNELS_CPU_ADAMW_H_
#define TANDEM_KERNELS_CPU_ADAMW_H_

#include <cstdint>

namespace tandem::cpu {

// The per-step constants of an AdamW update (PyTorch semantics), shared by the CPU and CUDA
// element updates so both compute the same thing.
struct AdamWStep {
  float step_size = 0.0f;              // lr / (1 - beta1^t)
  float bias_correction2_sqrt = 1.0f;  // sqrt(1 - beta2^t)
  float decay_factor = 1.0f;           // 1 - lr * weight_decay
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;

  // Constants of update number t (1-based).
  static AdamWStep For(float lr, int64_t t, float beta1, float beta2, float eps,
                       float weight_decay);
};

// For every element i < n:
//   p *= decay_factor (only if decay);  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g²
//   p -= step_size · m / (sqrt(v) / bias_correction2_sqrt + eps)
void AdamWUpdate(float* value, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                 bool decay, const AdamWStep& step);

}  // namespace tandem::cpu

#endif  // TANDEM_KERNELS_CPU_ADAMW_H_
