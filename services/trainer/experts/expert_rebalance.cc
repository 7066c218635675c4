#include "services/trainer/experts/expert_rebalance.h"

#include <algorithm>
#include <map>
#include <optional>
#include <vector>

#include "common/logging.h"
#include "common/status.h"
#include "placement/balance_planner.h"
#include "services/trainer/experts/placement_change.h"
#include "services/trainer/ranks/rank_agreement.h"

namespace tandem::trainer {
namespace {

// The step's load: routed rows per expert over every rank of `ranks` and every layer.
absl::StatusOr<std::vector<float>> StepLoad(Communicator& ranks, const std::vector<int16_t>& routes,
                                            int experts) {
  std::vector<float> load(experts, 0.0f);
  for (int16_t expert : routes) {
    if (expert >= 0 && expert < experts) load[expert] += 1;
  }
  if (absl::Status status = ranks.AllReduceSum(load.data(), experts); !status.ok()) return status;
  return load;
}

// The step's plan: one micro-batch of `load` over the group's ranks from the current owners, a
// move only when it gains more than a tenth of an average expert's load.
absl::StatusOr<placement::BalancePlan> Plan(const std::vector<float>& load,
                                            const engine::ExpertPlacement& current,
                                            placement::StepLoad& step) {
  step = {.micro_batches = 1, .experts = static_cast<int>(load.size())};
  double total = 0;
  for (float rows : load) {
    step.tokens.push_back(static_cast<int64_t>(rows));
    total += rows;
  }
  return placement::PlanBalance(
      step,
      {.ranks = current.ranks(),
       .ranks_per_node = current.ranks(),
       .replica_slots_per_rank = kReplicaSlotsPerRank},
      current.Owners(), {.move_cost_tokens = total / (10.0 * static_cast<double>(load.size()))});
}

// `home`'s placement: each rank keeps the experts it holds and stays their home, in their order,
// and takes the experts coming to it after them, in id order.
engine::ExpertPlacement PlacementOf(const placement::BalancePlan& plan,
                                    const engine::ExpertPlacement& current) {
  engine::ExpertPlacement next;
  for (int rank = 0; rank < current.ranks(); ++rank) {
    std::vector<int>& held = next.experts.emplace_back();
    for (int expert : current.experts[rank]) {
      if (plan.home[expert] == rank) held.push_back(expert);
    }
    for (int expert = 0; expert < static_cast<int>(plan.home.size()); ++expert) {
      if (plan.home[expert] == rank && std::find(held.begin(), held.end(), expert) == held.end()) {
        held.push_back(expert);
      }
    }
  }
  return next;
}

// `owners` (the plan's homes) with the plan's replicas: every copy of a replicated expert that is
// not its home, its share the copy's planned tokens (at least 1). Nullopt without replicas.
std::optional<engine::ExpertPlacement> ReplicasOf(const placement::BalancePlan& plan,
                                                  const engine::ExpertPlacement& owners) {
  std::map<int, std::map<int, int64_t>> tokens;  // Expert -> copy's rank -> its tokens.
  for (const placement::ExpertCopy& copy : plan.micro_batches[0].copies) {
    tokens[copy.expert][copy.rank] = copy.tokens;
  }
  engine::ExpertPlacement replicated = owners;
  replicated.replicas.assign(owners.ranks(), {});
  for (const auto& [expert, by_rank] : tokens) {
    const int home = plan.home[expert];
    const auto at_home = by_rank.find(home);
    std::vector<int64_t> shares = {
        std::max<int64_t>(1, at_home == by_rank.end() ? 0 : at_home->second)};
    for (const auto& [rank, planned] : by_rank) {
      if (rank == home) continue;
      replicated.replicas[rank].push_back(expert);
      shares.push_back(std::max<int64_t>(1, planned));
    }
    if (shares.size() > 1) replicated.shares[expert] = std::move(shares);
  }
  if (!replicated.has_replicas()) return std::nullopt;
  return replicated;
}

int ReplicasMade(const std::optional<engine::ExpertPlacement>& replicated) {
  int made = 0;
  if (replicated.has_value()) {
    for (const std::vector<int>& held : replicated->replicas) made += static_cast<int>(held.size());
  }
  return made;
}

}  // namespace

absl::StatusOr<Rebalanced> RebalanceExperts(Communicator& ranks, Communicator& group,
                                            engine::ExpertParallelExchange& exchange,
                                            const std::vector<int16_t>& routes,
                                            engine::BaseModel& base, engine::LoraAdapter& lora,
                                            engine::AdamW& optimizer) {
  // Every group plans from the whole job's load, so all take the same placement and the copies
  // of an expert stay on the same group rank (their gradients are summed over the copies).
  absl::StatusOr<std::vector<float>> load = StepLoad(ranks, routes, base.config().num_experts);
  if (!load.ok()) return load.status();
  const engine::ExpertPlacement current = exchange.placement();
  placement::StepLoad step;
  absl::StatusOr<placement::BalancePlan> plan = Plan(*load, current, step);
  if (!plan.ok()) {
    // Every rank plans from the same load and placement: all keep it alike.
    spdlog::warn("expert placement kept for this step: {}", plan.status().ToString());
    return Rebalanced{};
  }
  Rebalanced rebalanced{
      .experts_moved = plan->experts_moved,
      .imbalance_before = placement::MaxOverMean(
          placement::HomeRankTokens(step, 0, current.Owners(), current.ranks())),
      .imbalance_after = placement::MaxOverMean(plan->micro_batches[0].rank_tokens)};
  const engine::ExpertPlacement owners = PlacementOf(*plan, current);
  if (owners != current) {
    if (absl::Status status = ChangePlacement(group, exchange, owners, base, lora, optimizer);
        !status.ok()) {
      return status;
    }
  }
  rebalanced.replicas = ReplicasOf(*plan, owners);
  if (rebalanced.replicas.has_value()) {
    // Every rank plans alike; a plan this code cannot follow is a bug to report, not a crash.
    if (absl::Status valid = engine::ValidatePlacement(
            *rebalanced.replicas, static_cast<int>(load->size()), group.size());
        !valid.ok()) {
      spdlog::warn("the step's replicas are dropped: {}", valid.ToString());
      rebalanced.replicas.reset();
    }
  }
  rebalanced.replicas_made = ReplicasMade(rebalanced.replicas);
  return rebalanced;
}

}  // namespace tandem::trainer
