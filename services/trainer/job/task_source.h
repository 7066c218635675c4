#ifndef TANDEM_SERVICES_TRAINER_TASK_SOURCE_H_
#define TANDEM_SERVICES_TRAINER_TASK_SOURCE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "engine/tasks.h"
#include "engine/text/text_codec.h"
#include "tandem/trainer/v1/trainer.pb.h"

namespace tandem::trainer {

// The prompts and verifier of a job whose spec ResolveJobSpec resolved (the "digits" param and the
// dataset's field names are set): a built-in task, or a JSON-lines dataset whose answers are
// checked by the job's verifier (prompts drawn uniformly with replacement); a dataset row's
// conversation is rendered by `codec`'s chat format. INVALID_ARGUMENT for a bad task; NOT_FOUND /
// INVALID_ARGUMENT naming the line for a missing or malformed file; FAILED_PRECONDITION for
// conversations to a model without a chat format.
absl::StatusOr<std::unique_ptr<engine::Task>> MakeJobTask(const trainer::v1::JobSpec& spec,
                                                          const engine::text::TextCodec& codec);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_TASK_SOURCE_H_
