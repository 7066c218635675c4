#ifndef TANDEM_PLACEMENT_EXPERT_REBALANCE_H_
#define TANDEM_PLACEMENT_EXPERT_REBALANCE_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/communicator.h"
#include "engine/expert_parallel_exchange.h"
#include "engine/model.h"
#include "engine/optimizer.h"

namespace tandem::placement {

// Load imbalance over the MoE layers of a step: per layer, max / mean of the routed rows each
// rank of an expert-parallel group computes (1 is even); their mean and the worst layer's.
struct LayerImbalance {
  double mean = 1;
  double worst = 1;
};

// What re-placing the experts before a step did, each MoE layer by its own load.
struct Rebalanced {
  int experts_moved = 0;  // Over every MoE layer.
  LayerImbalance before;  // With the placements the step found.
  LayerImbalance after;   // With the planned ones, replicas included.
  // What the group's ranks sent each other for it: the moved experts' base weights, LoRA,
  // LoRA gradients and AdamW moments, and the replicas' base weights and LoRA, plus their LoRA
  // gradients going back to the owners, each time replicas are held in the step. Per group.
  int64_t bytes_moved = 0;
  // The new owners with the step's replicas (PolicyUpdater::UseReplicas); none planned: nullopt.
  std::optional<LayerPlacements> replicas;
  int replicas_made = 0;  // Over every MoE layer.
};

// What moves and replicas cost: the link rate between the group's ranks (as the deployment
// states it), the seconds its experts took per routed row and pass (as the job measured them so
// far), and what a step does with each routed row (PolicyUpdater::ExpertPassesPerStep): passes
// through its expert, those of them while replicas are held, and how often replicas are taken
// and given back. A zero: unknown, or not measured yet (the first step).
struct BalanceCosts {
  double link_bytes_per_second = 0;
  double seconds_per_row = 0;
  int passes_per_step = 0;
  int replica_passes_per_step = 0;
  int replica_holds_per_step = 0;
};

// At most this many replicas per rank, MoE layer and step (ReLibra's budget of extra expert
// slots).
inline constexpr int kReplicaSlotsPerRank = 2;

// Before a step of an expert-parallel job (ReLibra's reordering across ranks and replication of
// hot experts), each MoE layer on its own: the layer's load per expert in the step -- `routes`,
// this rank's replayed routes ([tokens, MoE layers, top_k] logical ids; -1: none), summed over
// `ranks`, every rank of the job, so that every expert-parallel group takes the same placements
// -- planned in process by PlanBalance, the moves applied by ChangePlacement over
// `group`, this rank's expert-parallel group, the replicas returned for the step's training
// passes (at most kReplicaSlotsPerRank per rank). A move or a replica is made only when it pays
// for itself within the step: the expert compute time it saves on the busiest rank (its tokens x
// passes x seconds per row) exceeds the time its bytes take over the link. Until `costs` are
// measured, a move is priced at a tenth of an average expert's load in that layer and replicas at
// nothing. Every rank plans with rank 0's costs. Collective over both. A layer whose plan fails
// keeps its placement on every rank alike (same load, same placement) and gets no replicas. Fails
// only when a collective or a move does.
absl::StatusOr<Rebalanced> RebalanceExperts(Communicator& ranks, Communicator& group,
                                            engine::ExpertParallelExchange& exchange,
                                            const std::vector<int16_t>& routes, BalanceCosts costs,
                                            engine::BaseModel& base, engine::LoraAdapter& lora,
                                            engine::AdamW& optimizer);

}  // namespace tandem::placement

#endif  // TANDEM_PLACEMENT_EXPERT_REBALANCE_H_
