#ifndef TANDEM_SERVICES_TRAINER_EXPERT_REBALANCE_H_
#define TANDEM_SERVICES_TRAINER_EXPERT_REBALANCE_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/communicator.h"
#include "engine/expert_parallel_exchange.h"
#include "engine/model.h"
#include "engine/optimizer.h"

namespace tandem::trainer {

// What re-placing the experts before a step did.
struct Rebalanced {
  int experts_moved = 0;
  // max / mean of the rows each rank of the group computes in the step, before and after.
  double imbalance_before = 1;
  double imbalance_after = 1;
  // The new owners with the step's replicas (PolicyUpdater::UseReplicas); none planned: nullopt.
  std::optional<engine::ExpertPlacement> replicas;
  int replicas_made = 0;
};

// At most this many replicas per rank and step (ReLibra's budget of extra expert slots).
inline constexpr int kReplicaSlotsPerRank = 2;

// Before a step of an expert-parallel job (ReLibra's reordering across ranks and replication of
// hot experts): the step's load per expert -- `routes`, this rank's replayed routes (logical ids;
// -1: none), counted over every MoE layer and summed over `ranks`, every rank of the job, so that
// every expert-parallel group takes the same placement -- planned in process by
// placement::PlanBalance (one placement for every layer, a move only when it gains more than a
// tenth of an average expert's load, at most kReplicaSlotsPerRank replicas per rank), its moves
// applied by ChangePlacement over `group`, this rank's expert-parallel group, its replicas
// returned for the step's training passes. Collective over both. A plan that fails fails alike
// on every rank (same load, same placement): no group moves and the result names no replicas.
// Fails only when a collective or a move does.
absl::StatusOr<Rebalanced> RebalanceExperts(Communicator& ranks, Communicator& group,
                                            engine::ExpertParallelExchange& exchange,
                                            const std::vector<int16_t>& routes,
                                            engine::BaseModel& base, engine::LoraAdapter& lora,
                                            engine::AdamW& optimizer);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_EXPERT_REBALANCE_H_
