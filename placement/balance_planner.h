#ifndef TANDEM_PLACEMENT_BALANCE_PLANNER_H_
#define TANDEM_PLACEMENT_BALANCE_PLANNER_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

// Routing-guided expert balance (ReLibra: Jin, Wei, Zhong et al., "Routing-Replay-Guided Load
// Balancing for MoE Training in Reinforcement Learning"). In RL the trainer knows every
// micro-batch's routing before it trains (the routes rollout recorded, which R3 replays), so it
// can balance each step's actual load instead of predicting it: between steps, experts are
// reordered across ranks so that every micro-batch of the step is even across nodes and ranks
// (moving an expert costs its bytes); within a step, each micro-batch's hot experts get replicas on
// other ranks of the same node (fast links) and their tokens are split among the copies. One MoE
// layer at a time; no service dependencies.
namespace tandem::placement {

// The expert-parallel ranks of one layer.
struct EpTopology {
  int ranks = 0;
  int ranks_per_node = 0;  // Divides ranks.
  // Extra expert slots per rank and micro-batch for replicas (beyond its ranks-th of the
  // experts, which every rank holds as their home).
  int replica_slots_per_rank = 2;
};

// A step's routed tokens: tokens[m * experts + e] token-to-expert assignments of expert e in
// micro-batch m.
struct StepLoad {
  int micro_batches = 0;
  int experts = 0;
  std::vector<int64_t> tokens;

  int64_t at(int micro_batch, int expert) const {
    return tokens[static_cast<size_t>(micro_batch) * experts + expert];
  }
};

struct BalanceOptions {
  // What moving one expert to another rank costs, in tokens of expert compute (its bytes over
  // the link, priced as the compute that time could have done): a move is made only when it
  // lowers the step's load imbalance by more than this.
  double move_cost_tokens = 0;
  // What one new replica costs, in the same tokens (the expert's bytes copied in and its
  // gradients sent back): a micro-batch makes a replica only when it takes more than this off
  // the hot rank. Tokens moved to a copy the target holds already cost nothing.
  double replica_cost_tokens = 0;
};

// One copy of an expert that serves part of a micro-batch's tokens: its home or a replica.
struct ExpertCopy {
  int expert = 0;
  int rank = 0;
  int64_t tokens = 0;
};

struct MicroBatchPlan {
  // The replicated experts' copies (home included), and how their tokens split; experts not
  // listed keep all their tokens at home.
  std::vector<ExpertCopy> copies;
  std::vector<int64_t> rank_tokens;  // Per rank, after replication.
};

struct BalancePlan {
  std::vector<int> home;  // Expert -> rank for the step (experts / ranks on each).
  int experts_moved = 0;  // Homes that differ from the current placement.
  std::vector<MicroBatchPlan> micro_batches;
};

// Plans one step of one layer from its load and the current homes (expert -> rank, experts /
// ranks per rank). INVALID_ARGUMENT for a topology, load or placement that does not fit
// (ranks_per_node must divide ranks and ranks the experts; tokens >= 0), whose details name the
// field as PlanBalanceRequest does (ranks_per_node, tokens[7], current_home[2]).
absl::StatusOr<BalancePlan> PlanBalance(const StepLoad& load, const EpTopology& topology,
                                        const std::vector<int>& current_home,
                                        const BalanceOptions& options = {});

// Per-rank tokens of micro-batch `micro_batch` with every expert's tokens at its home.
std::vector<int64_t> HomeRankTokens(const StepLoad& load, int micro_batch,
                                    const std::vector<int>& home, int ranks);

// max / mean of per-rank tokens (1 when there are none): 1 is perfect balance. Tokens may be
// fractional (a planner that splits an expert's tokens evenly over its replicas).
template <typename Tokens>
double MaxOverMean(const std::vector<Tokens>& rank_tokens) {
  double total = 0, most = 0;
  for (const Tokens t : rank_tokens) {
    total += static_cast<double>(t);
    most = std::max(most, static_cast<double>(t));
  }
  return total > 0 ? most * static_cast<double>(rank_tokens.size()) / total : 1;
}

// Expert e on rank e * ranks / experts: the static contiguous placement.
std::vector<int> ContiguousHomes(int experts, int ranks);

}  // namespace tandem::placement

#endif  // TANDEM_PLACEMENT_BALANCE_PLANNER_H_
