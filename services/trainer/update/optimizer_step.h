#ifndef TANDEM_SERVICES_TRAINER_UPDATE_OPTIMIZER_STEP_H_
#define TANDEM_SERVICES_TRAINER_UPDATE_OPTIMIZER_STEP_H_

#include "absl/status/statusor.h"
#include "engine/optimizer.h"

namespace tandem::trainer {

struct OptimizerSettings {
  // The learning rate of every update, by the optimizer's own step count (which a checkpoint
  // restores).
  engine::ScheduleConfig schedule = engine::ScheduleConfig::Constant(1e-4f);
  float max_grad_norm = 1.0f;  // 0: measure only.
};

struct OptimizerStep {
  double grad_norm = 0;      // Before clipping.
  double learning_rate = 0;  // Of the step taken; 0 when none was.
  bool stepped = false;      // False when the norm was not finite: the update is skipped.
};

// The optimizer layer of an update: clips `optimizer`'s gradients to settings.max_grad_norm
// given their norm over every rank (GradientSync::GlobalGradNorm), then steps AdamW at the
// schedule's rate. A gradient that is not finite skips the step, so one bad batch never reaches
// the parameters. The gradients are left as clipped; the caller zeroes them.
absl::StatusOr<OptimizerStep> ClipAndStep(engine::AdamW& optimizer,
                                          const OptimizerSettings& settings, double global_norm);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_UPDATE_OPTIMIZER_STEP_H_
