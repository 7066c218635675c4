#include "services/trainer/update/optimizer_step.h"

#include <cmath>

namespace tandem::trainer {

absl::StatusOr<OptimizerStep> ClipAndStep(engine::AdamW& optimizer,
                                          const OptimizerSettings& settings, double global_norm) {
  OptimizerStep step;
  step.grad_norm = engine::ClipGradNormTo(optimizer.params(), settings.max_grad_norm, global_norm);
  if (!std::isfinite(step.grad_norm)) return step;
  const float learning_rate = engine::LearningRate(settings.schedule, optimizer.step());
  if (absl::Status status = optimizer.Step(learning_rate); !status.ok()) return status;
  step.learning_rate = learning_rate;
  step.stepped = true;
  return step;
}

}  // namespace tandem::trainer
