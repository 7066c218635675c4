#ifndef TANDEM_ENGINE_OPTIMIZER_H_
#define TANDEM_ENGINE_OPTIMIZER_H_

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::engine {

// A trainable tensor the optimizer updates in place; the model owns the memory, which must
// outlive the optimizer.
struct Param {
  std::string name;
  float* value = nullptr;
  float* grad = nullptr;
  int64_t size = 0;
  bool decay = true;  // False for tensors weight decay must not shrink (e.g. norm gains).
};

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
};

// INVALID_ARGUMENT naming the field: betas in [0, 1), eps > 0, weight_decay >= 0.
absl::Status Validate(const AdamWConfig& config);

// Everything AdamW needs to continue bit-exactly, as named tensors for a checkpoint:
// "<param name>.exp_avg" and "<param name>.exp_avg_sq" (PyTorch's state names), plus the step.
struct AdamWState {
  int64_t step = 0;
  std::map<std::string, std::vector<float>> tensors;
};

// AdamW with PyTorch semantics: per step t, for every element,
//   p -= lr * weight_decay * p                  (decoupled: outside the adaptive scaling)
//   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g^2
//   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
class AdamW {
 public:
  // INVALID_ARGUMENT for a bad config, an empty or repeated name, a negative size or a null
  // pointer in a non-empty param.
  static absl::StatusOr<AdamW> Create(const AdamWConfig& config, std::vector<Param> params);

  // One update with learning rate `lr` (e.g. LearningRate(schedule, step())); INVALID_ARGUMENT,
  // and nothing changes, if lr is negative or not finite.
  absl::Status Step(float lr);

  // Updates taken so far; the next Step is update step() + 1.
  int64_t step() const { return step_; }
  const std::vector<Param>& params() const { return params_; }

  // The same tensors (names, sizes and order) now at `params`' addresses, moments kept: after
  // their memory moved (ReleaseReplicas). INVALID_ARGUMENT, changing nothing, otherwise.
  absl::Status Rebind(std::vector<Param> params);

  AdamWState ExportState() const;
  // INVALID_ARGUMENT, changing nothing, unless `state` holds exactly this optimizer's tensors
  // with matching sizes and a non-negative step.
  absl::Status ImportState(const AdamWState& state);

 private:
  AdamW(const AdamWConfig& config, std::vector<Param> params);

  absl::Status CheckState(const AdamWState& state) const;

  AdamWConfig config_;
  std::vector<Param> params_;
  std::vector<std::vector<float>> exp_avg_;     // First moments, one per param.
  std::vector<std::vector<float>> exp_avg_sq_;  // Second moments, one per param.
  int64_t step_ = 0;
};

// Scales all gradients together so their global L2 norm is at most max_norm, as PyTorch's
// clip_grad_norm_ does (factor max_norm / (norm + 1e-6), only when below 1), and returns the
// norm before clipping. max_norm <= 0 only measures. A non-finite norm leaves the gradients
// untouched and is returned as is, so the caller can skip the step.
float ClipGradNorm(std::span<const Param> params, float max_norm);
// The parts of ClipGradNorm, for gradients spread over ranks: the sum of squares of `params`'
// gradients, and the clipping of `params` to max_norm given the norm of all the gradients.
double SquaredGradNorm(std::span<const Param> params);
float ClipGradNormTo(std::span<const Param> params, float max_norm, double norm);

// How the learning rate falls from peak_lr to min_lr after the warmup.
enum class LrDecay { kCosine, kLinear, kConstant };

struct ScheduleConfig {
  float peak_lr = 1e-3f;
  float min_lr = 0.0f;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  LrDecay decay = LrDecay::kCosine;

  // peak_lr for every step (no warmup, no decay).
  static ScheduleConfig Constant(float lr) {
    return {.peak_lr = lr, .min_lr = lr, .decay = LrDecay::kConstant};
  }
};

// INVALID_ARGUMENT naming the field: peak_lr > 0, min_lr in [0, peak_lr], warmup_steps >= 0,
// total_steps >= 1, warmup_steps <= total_steps.
absl::Status Validate(const ScheduleConfig& config);

// Learning rate for the update with 0-based index `step` (AdamW::step() before the update):
//   step < warmup:          peak_lr * (step + 1) / warmup  (the first update is not wasted at 0)
//   warmup <= step < total: min_lr + (peak_lr - min_lr) * f(progress), with progress =
//                           (step - warmup) / (total - warmup) and f = (1 + cos(pi p)) / 2
//                           (cosine), 1 - p (linear) or 1 (constant: peak_lr until the end)
//   step >= total:          min_lr (training past the schedule keeps the floor), except that a
//                           constant schedule stays at peak_lr
// warmup 0 starts at peak_lr; warmup == total warms up and then drops straight to min_lr; a
// negative step counts as 0. Requires a config that passes Validate.
float LearningRate(const ScheduleConfig& config, int64_t step);

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_OPTIMIZER_H_
