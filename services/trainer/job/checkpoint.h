#ifndef TANDEM_SERVICES_TRAINER_CHECKPOINT_H_
#define TANDEM_SERVICES_TRAINER_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/config.h"
#include "engine/model.h"
#include "engine/optimizer.h"

namespace tandem::trainer {

// PPO's critic, which only the trainer holds: the value head's tensors by name and the state of
// its own optimizer.
struct CriticState {
  std::map<std::string, std::vector<float>> head;
  engine::AdamWState optimizer;
};

// Who wrote a checkpoint. A job resumes only a checkpoint it wrote itself, for the spec it runs.
struct CheckpointOwner {
  std::string job_id;
  std::string spec_fingerprint;  // SpecFingerprint of the job's resolved spec.
  // The checkpoint the job started from (its spec's initial_checkpoint_dir): that job's id, or
  // the directory where the checkpoint names no job. Empty for a job that started fresh.
  std::string initialized_from;

  friend bool operator==(const CheckpointOwner&, const CheckpointOwner&) = default;
};

// Everything a job needs to continue after a restart. The data order and every sampling seed are
// functions of (job seed, step), so the step is the whole RNG state.
struct Checkpoint {
  CheckpointOwner owner;  // Empty job_id: written before checkpoints named their job.
  int64_t step = 0;
  int64_t policy_version = 0;  // Last version published when it was taken.
  engine::LoraAdapter lora;
  engine::AdamWState optimizer;
  std::optional<CriticState> critic;  // Of PPO jobs.
};

// One safetensors file, <dir>/checkpoint.safetensors: the adapter ("lora/..."), the optimizer
// moments ("optimizer/..."), a critic's head and moments ("critic/head/...",
// "critic/optimizer/...") and the owner, steps, version and configs in the metadata. Written to a
// temporary file, fsynced and renamed, so a crash leaves the previous checkpoint or the new one.
absl::Status SaveCheckpoint(const std::string& dir, const CheckpointOwner& owner, int64_t step,
                            int64_t policy_version, const engine::LoraAdapter& lora,
                            const engine::AdamWState& optimizer,
                            const CriticState* critic = nullptr);

// The checkpoint under `dir`, or nullopt when there is none; errors for a corrupt file or one made
// for another model.
absl::StatusOr<std::optional<Checkpoint>> LoadCheckpoint(const std::string& dir,
                                                         const engine::ModelConfig& model);

// The owner and step of the checkpoint under `dir` (reading no tensor), or nullopt when there is
// none.
struct CheckpointSummary {
  CheckpointOwner owner;
  int64_t step = 0;
};
absl::StatusOr<std::optional<CheckpointSummary>> ReadCheckpointSummary(const std::string& dir);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_CHECKPOINT_H_
