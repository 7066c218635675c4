#include "services/trainer/update/expert_parallel_update.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "engine/expert_parallel_exchange.h"
#include "placement/expert_moves.h"
#include "placement/expert_replicas.h"

namespace tandem::trainer {

absl::Status CheckExpertParallelism(const PolicyUpdateConfig& config,
                                    const engine::LoraAdapter& lora, bool critic) {
  if (config.expert_parallel.exchange == nullptr) return absl::OkStatus();
  if (critic) {
    return absl::UnimplementedError("a critic with expert parallelism is not supported yet");
  }
  const PolicyUpdateConfig::ExpertParallelism& experts = config.expert_parallel;
  const int same = experts.same_experts == nullptr ? 1 : experts.same_experts->size();
  if (experts.group == nullptr || config.data_parallel == nullptr ||
      config.data_parallel->size() != experts.group->size() * same) {
    return InvalidRequest("BAD_EXPERT_PARALLELISM",
                          "expert parallelism needs its group, and data-parallel ranks = group "
                          "ranks x ranks holding the same experts");
  }
  if (absl::Status held = placement::CheckHeldExperts(experts.exchange->placements(),
                                                      experts.group->rank(), lora.parameters(),
                                                      /*with_replicas=*/false);
      !held.ok()) {
    return InvalidRequest(
        "BAD_EXPERT_PARALLELISM",
        absl::StrCat("the adapter must hold exactly this rank's experts of each MoE layer, in "
                     "the exchange's order (LoraAdapter::ExpertShard): ",
                     held.message()));
  }
  return absl::OkStatus();
}

absl::Status ReplicaHold::Hold() {
  if (!active()) return absl::OkStatus();
  Communicator& group = *experts_.group;
  for (engine::ParameterSet* parameters : {&base_.parameters(), &lora_.parameters()}) {
    if (absl::Status status = placement::HoldReplicas(group, *replicas_, *parameters);
        !status.ok()) {
      return status;
    }
  }
  return experts_.exchange->SetPlacements(*replicas_);
}

absl::Status ReplicaHold::Release() {
  if (!active()) return absl::OkStatus();
  Communicator& group = *experts_.group;
  for (engine::ParameterSet* parameters : {&base_.parameters(), &lora_.parameters()}) {
    if (absl::Status status = placement::ReleaseReplicas(group, *replicas_, *parameters);
        !status.ok()) {
      return status;
    }
  }
  if (absl::Status status = experts_.exchange->SetPlacements(replicas_->Owned()); !status.ok()) {
    return status;
  }
  return optimizer_.Rebind(engine::OptimizerParams(lora_.parameters()));
}

void ReplicaHold::Drop() {
  if (!active()) return;
  const int rank = experts_.group->rank();
  for (engine::ParameterSet* parameters : {&base_.parameters(), &lora_.parameters()}) {
    placement::DropReplicas(*replicas_, rank, *parameters);
  }
  absl::Status restored = experts_.exchange->SetPlacements(replicas_->Owned());
  if (restored.ok()) restored = optimizer_.Rebind(engine::OptimizerParams(lora_.parameters()));
  if (!restored.ok()) spdlog::error("dropping the step's replicas: {}", restored.ToString());
}

}  // namespace tandem::trainer
