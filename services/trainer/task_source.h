#ifndef TANDEM_SERVICES_TRAINER_TASK_SOURCE_H_
#define TANDEM_SERVICES_TRAINER_TASK_SOURCE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "engine/tasks.h"
#include "tandem/v1/trainer.pb.h"

namespace tandem::trainer {

// The prompts and verifier of a job: a built-in task ("digits" param, default 2), or a JSON-lines
// dataset whose answers are checked by exact match (prompts drawn uniformly with replacement).
// INVALID_ARGUMENT for a bad task; NOT_FOUND / INVALID_ARGUMENT for a missing or malformed file.
absl::StatusOr<std::unique_ptr<engine::Task>> MakeJobTask(const v1::JobSpec& spec);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_TASK_SOURCE_H_
