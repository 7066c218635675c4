#ifndef TANDEM_SERVICES_TRAINER_TRAINING_STATE_H_
#define TANDEM_SERVICES_TRAINER_TRAINING_STATE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/communicator.h"
#include "engine/model.h"
#include "engine/optimizer.h"
#include "services/trainer/job/checkpoint.h"
#include "services/trainer/job/job_plan.h"
#include "services/trainer/rl/value_head.h"
#include "services/trainer/update/policy_update.h"

namespace tandem::trainer {

// The base model a job trains on.
struct JobModel {
  std::unique_ptr<engine::BaseModel> base;
  // config.json's architecture, "" for an engine file: names the PEFT modules of an initial
  // adapter and labels each published version.
  std::string architecture;
};

// The spec's base model (FAILED_PRECONDITION naming it), with the spec's sampling checked against
// its vocabulary (INVALID_ARGUMENT).
absl::StatusOr<JobModel> LoadJobModel(const trainer::v1::JobSpec& spec);

// Where a run's state comes from.
struct StateOrigin {
  std::optional<Checkpoint> checkpoint;  // None: a new adapter.
  bool resuming = false;                 // The checkpoint is the job's own, taken at a step.
  // Rank 0 of a new job reads the spec's initial adapter; a rank > 0 only needs the state's shape
  // (its values come from rank 0, Broadcast).
  bool read_initial_adapter = true;
};

// What a job trains and what its checkpoints hold: the LoRA with its optimizer and PPO's value
// head with its own, over the frozen base model.
class TrainingState {
 public:
  // The state at `origin`: a checkpoint's LoRA and optimizer (and critic: a resume needs it back,
  // DATA_LOSS without; a start from another job's checkpoint trains a fresh head when it has
  // none), else the spec's initial PEFT adapter (FAILED_PRECONDITION for another LoRA shape), else
  // A random and B zero.
  static absl::StatusOr<std::unique_ptr<TrainingState>> Create(const JobPlan& plan, JobModel model,
                                                               StateOrigin origin);

  engine::BaseModel& base() { return *model_.base; }
  const engine::ModelConfig& model_config() const { return model_.base->config(); }
  const std::string& architecture() const { return model_.architecture; }
  engine::LoraAdapter& lora() { return *lora_; }
  const engine::LoraAdapter& lora() const { return *lora_; }
  engine::AdamW& optimizer() { return *optimizer_; }

  // The plan's update configuration, pointed at this state's critic, at `ranks` (null: one) and
  // at the expert-parallel exchange and groups (none by default).
  PolicyUpdateConfig UpdateConfig(const JobPlan& plan, Communicator* ranks,
                                  PolicyUpdateConfig::ExpertParallelism experts = {});
  // Every rank's state <- rank 0's (LoRA, optimizer, critic).
  absl::Status Broadcast(Communicator& ranks);
  // Keeps only the routed `experts` (global ids, in that order) of every MoE layer: of the base
  // model, the LoRA and its optimizer state (an expert-parallel rank's share, after Broadcast).
  // The whole copies are released. Not with a critic.
  absl::Status KeepExperts(const JobPlan& plan, const std::vector<int>& experts);
  // INTERNAL for a non-finite loss, gradient norm or LoRA value after `step`'s update: training on
  // would publish a broken adapter and end the job SUCCEEDED.
  absl::Status CheckFinite(int64_t step, const UpdateStats& stats) const;
  // Writes a checkpoint of the whole state. An expert-parallel rank (`experts`: its group; every
  // rank of the group calls, collectively) first joins the group's experts, so the checkpoint
  // holds them all; then only a rank with `write` writes.
  absl::Status SaveCheckpoint(const std::string& dir, const CheckpointOwner& owner, int64_t step,
                              int64_t policy_version, Communicator* experts = nullptr,
                              bool write = true) const;

 private:
  explicit TrainingState(JobModel model) : model_(std::move(model)) {}
  absl::Status StartAdapter(const JobPlan& plan, StateOrigin& origin);
  absl::Status CreateOptimizers(const JobPlan& plan);
  absl::Status RestoreCritic(const std::optional<CriticState>& critic);

  JobModel model_;
  std::unique_ptr<engine::LoraAdapter> lora_;  // Held by pointer: the optimizer points into it.
  std::optional<engine::AdamW> optimizer_;
  std::optional<ValueHead> value_head_;  // PPO's critic, with an optimizer of its own.
  std::optional<engine::AdamW> critic_optimizer_;
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_TRAINING_STATE_H_
