#ifndef TANDEM_SERVICES_TRAINER_UPDATE_EXPERT_PARALLEL_UPDATE_H_
#define TANDEM_SERVICES_TRAINER_UPDATE_EXPERT_PARALLEL_UPDATE_H_

#include "absl/status/status.h"
#include "engine/model.h"
#include "engine/optimizer.h"
#include "placement/expert_placement.h"
#include "services/trainer/update/policy_update_config.h"

namespace tandem::trainer {

// INVALID_ARGUMENT for an expert-parallel configuration that would train wrong (groups that do
// not multiply to the data-parallel ranks, an adapter that is not this rank's shard);
// UNIMPLEMENTED with a critic. OK without expert parallelism.
absl::Status CheckExpertParallelism(const PolicyUpdateConfig& config,
                                    const engine::LoraAdapter& lora, bool critic);

// Replicas of hot experts around one mini-batch's passes (PolicyUpdater::UseReplicas): Hold has
// the model and the adapter take the replicas and the exchange compute with them; Release sends
// the replicas' gradients to their owners, restores the owners' placement and has the optimizer
// follow the adapter's memory; Drop does the last two on this rank alone after a failure in
// between. Each does nothing without replicas or expert parallelism. None is owned.
class ReplicaHold {
 public:
  ReplicaHold(const std::optional<placement::LayerPlacements>& replicas,
              const PolicyUpdateConfig::ExpertParallelism& experts, engine::BaseModel& base,
              engine::LoraAdapter& lora, engine::AdamW& optimizer)
      : replicas_(replicas), experts_(experts), base_(base), lora_(lora), optimizer_(optimizer) {}

  absl::Status Hold();
  absl::Status Release();
  void Drop();

 private:
  bool active() const { return replicas_.has_value() && experts_.exchange != nullptr; }

  const std::optional<placement::LayerPlacements>& replicas_;
  const PolicyUpdateConfig::ExpertParallelism& experts_;
  engine::BaseModel& base_;
  engine::LoraAdapter& lora_;
  engine::AdamW& optimizer_;
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_UPDATE_EXPERT_PARALLEL_UPDATE_H_
