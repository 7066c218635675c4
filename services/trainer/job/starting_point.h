#ifndef TANDEM_SERVICES_TRAINER_STARTING_POINT_H_
#define TANDEM_SERVICES_TRAINER_STARTING_POINT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "engine/config.h"
#include "services/trainer/job/checkpoint.h"
#include "tandem/trainer/v1/trainer.pb.h"

namespace tandem::trainer {

// Whether two LoRA configs compute alike: targets compare as sets (PEFT keeps them as a set).
bool SameLora(const engine::LoraConfig& a, const engine::LoraConfig& b);

// Where a job's rank 0 starts.
struct StartingPoint {
  std::optional<Checkpoint> checkpoint;  // None: a new adapter (InitialAdapter).
  int64_t start_step = 0;                // The step a resumed checkpoint took; 0 for a start.
  std::string initialized_from;          // What the run's checkpoints record as its origin.
};

// The checkpoint a job starts from: its own in spec.output_dir (a resume from its step, refused
// when written under another spec), else spec.initial_checkpoint_dir's (a start at step 1 from
// it, refused for another LoRA shape), else none. Another job's checkpoint in output_dir is
// refused, never resumed. `owner` is this job's (id, spec fingerprint, origin so far).
absl::StatusOr<StartingPoint> FindStartingPoint(const trainer::v1::JobSpec& spec,
                                                const CheckpointOwner& owner,
                                                const engine::ModelConfig& model);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_STARTING_POINT_H_
