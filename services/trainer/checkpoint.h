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

// Everything a job needs to continue after a restart. The data order and every sampling seed are
// functions of (job seed, step), so the step is the whole RNG state.
struct Checkpoint {
  int64_t step = 0;
  int64_t policy_version = 0;  // Last version published when it was taken.
  engine::LoraAdapter lora;
  engine::AdamWState optimizer;
  std::optional<CriticState> critic;  // Of PPO jobs.
};

// One safetensors file, <dir>/checkpoint.safetensors: the adapter ("lora/..."), the optimizer
// moments ("optimizer/..."), a critic's head and moments ("critic/head/...",
// "critic/optimizer/...") and the steps, version and configs in the metadata. Written to a
// temporary file, fsynced and renamed, so a crash leaves the previous checkpoint or the new one.
absl::Status SaveCheckpoint(const std::string& dir, int64_t step, int64_t policy_version,
                            const engine::LoraAdapter& lora, const engine::AdamWState& optimizer,
                            const CriticState* critic = nullptr);

// The checkpoint under `dir`, or nullopt when there is none; errors for a corrupt file or one made
// for another model.
absl::StatusOr<std::optional<Checkpoint>> LoadCheckpoint(const std::string& dir,
                                                         const engine::ModelConfig& model);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_CHECKPOINT_H_
