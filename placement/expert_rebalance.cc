#include "placement/expert_rebalance.h"

#include <algorithm>
#include <map>
#include <optional>
#include <vector>

#include "absl/types/span.h"
#include "common/logging.h"
#include "placement/balance_planner.h"
#include "placement/placement_change.h"

namespace tandem::placement {
namespace {

// The step's load: routed rows per MoE layer and expert ([layer * experts + expert]) over every
// rank of `ranks`.
absl::StatusOr<std::vector<float>> StepLoads(Communicator& ranks,
                                             const std::vector<int16_t>& routes,
                                             const engine::ModelConfig& model) {
  const int layers = model.num_moe_layers(), experts = model.num_experts, k = model.top_k;
  std::vector<float> load(static_cast<size_t>(layers) * experts, 0.0f);
  for (size_t i = 0; i < routes.size(); ++i) {
    const int16_t expert = routes[i];
    const size_t layer = i / k % layers;
    if (expert >= 0 && expert < experts) load[layer * experts + expert] += 1;
  }
  if (absl::Status status = ranks.AllReduceSum(load.data(), static_cast<int64_t>(load.size()));
      !status.ok()) {
    return status;
  }
  return load;
}

// Bytes a move and a replica of one expert send (BalanceCosts prices them).
struct ExpertTraffic {
  int64_t move_bytes = 0;
  int64_t replica_bytes = 0;
};

// How often a step takes its replicas and gives them back (at least once).
int64_t ReplicaHolds(const BalanceCosts& costs) {
  return std::max(1, costs.replica_holds_per_step);
}

// One layer's plan: one micro-batch of `load` (the whole job's, of which each of `groups`
// expert-parallel groups computes about 1/groups) over the group's ranks from the current
// owners, moves and replicas priced in tokens of that load by `costs` (see RebalanceExperts).
absl::StatusOr<BalancePlan> Plan(absl::Span<const float> load, const ExpertPlacement& current,
                                 const BalanceCosts& costs, ExpertTraffic traffic, int groups,
                                 StepLoad& step) {
  step = {.micro_batches = 1, .experts = static_cast<int>(load.size())};
  double total = 0;
  for (float rows : load) {
    step.tokens.push_back(static_cast<int64_t>(rows));
    total += rows;
  }
  BalanceOptions options{.move_cost_tokens = total / (10.0 * static_cast<double>(load.size()))};
  // A token of the job's load saves a group 1/groups of its passes' compute; a replica saves only
  // in the passes made while it is held, and is taken and given back each time.
  const auto tokens = [&](double bytes, int passes) {
    return bytes / costs.link_bytes_per_second / (costs.seconds_per_row * passes) * groups;
  };
  if (costs.link_bytes_per_second > 0 && costs.seconds_per_row > 0 && costs.passes_per_step > 0) {
    options.move_cost_tokens =
        tokens(static_cast<double>(traffic.move_bytes), costs.passes_per_step);
    options.replica_cost_tokens =
        costs.replica_passes_per_step > 0
            ? tokens(static_cast<double>(traffic.replica_bytes * ReplicaHolds(costs)),
                     costs.replica_passes_per_step)
            : 0;
  }
  return PlanBalance(step,
                     {.ranks = current.ranks(),
                      .ranks_per_node = current.ranks(),
                      .replica_slots_per_rank = kReplicaSlotsPerRank},
                     current.Owners(), options);
}

// The costs every rank plans with: rank 0's of `ranks`.
absl::StatusOr<BalanceCosts> AgreedCosts(Communicator& ranks, const BalanceCosts& mine) {
  float values[] = {static_cast<float>(mine.link_bytes_per_second),
                    static_cast<float>(mine.seconds_per_row)};
  if (absl::Status status = ranks.Broadcast(values, 2, 0); !status.ok()) return status;
  BalanceCosts agreed = mine;  // The passes come from the job's config, alike on every rank.
  agreed.link_bytes_per_second = values[0];
  agreed.seconds_per_row = values[1];
  return agreed;
}

// `home`'s placement: each rank keeps the experts it holds and stays their home, in their order,
// and takes the experts coming to it after them, in id order.
ExpertPlacement PlacementOf(const BalancePlan& plan, const ExpertPlacement& current) {
  ExpertPlacement next;
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
std::optional<ExpertPlacement> ReplicasOf(const BalancePlan& plan, const ExpertPlacement& owners) {
  std::map<int, std::map<int, int64_t>> tokens;  // Expert -> copy's rank -> its tokens.
  for (const ExpertCopy& copy : plan.micro_batches[0].copies) {
    tokens[copy.expert][copy.rank] = copy.tokens;
  }
  ExpertPlacement replicated = owners;
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

// Floats of one expert of MoE layer `moe_layer` in `parameters`.
int64_t ExpertFloats(const engine::ParameterSet& parameters, int moe_layer) {
  int64_t floats = 0;
  for (const std::string& name : parameters.names()) {
    const engine::Parameter& parameter = *parameters.Find(name);
    if (parameter.stacked_experts && parameter.moe_layer == moe_layer) {
      floats += parameter.expert_size();
    }
  }
  return floats;
}

// The imbalance statistics of per-layer max / mean values.
LayerImbalance Summarize(const std::vector<double>& per_layer) {
  LayerImbalance summary;
  if (per_layer.empty()) return summary;
  double total = 0;
  summary.worst = 0;
  for (double value : per_layer) {
    total += value;
    summary.worst = std::max(summary.worst, value);
  }
  summary.mean = total / static_cast<double>(per_layer.size());
  return summary;
}

}  // namespace

absl::StatusOr<Rebalanced> RebalanceExperts(Communicator& ranks, Communicator& group,
                                            engine::ExpertParallelExchange& exchange,
                                            const std::vector<int16_t>& routes, BalanceCosts costs,
                                            engine::BaseModel& base, engine::LoraAdapter& lora,
                                            engine::AdamW& optimizer) {
  const engine::ModelConfig& model = base.config();
  // Every group plans from the whole job's load, so all take the same placements and the copies
  // of an expert stay on the same group rank (their gradients are summed over the copies).
  absl::StatusOr<std::vector<float>> load = StepLoads(ranks, routes, model);
  if (!load.ok()) return load.status();
  absl::StatusOr<BalanceCosts> agreed = AgreedCosts(ranks, costs);
  if (!agreed.ok()) return agreed.status();
  const LayerPlacements current = exchange.placements();
  LayerPlacements owners, replicated;
  std::vector<double> before, after;
  Rebalanced rebalanced;
  for (int layer = 0; layer < static_cast<int>(current.layers.size()); ++layer) {
    const ExpertPlacement& now = current.layers[layer];
    // A move sends the base weights and the LoRA with its gradients and both moments; a replica
    // takes the base weights and the LoRA, and gives the LoRA's gradients back.
    const int64_t base_floats = ExpertFloats(base.parameters(), layer);
    const int64_t lora_floats = ExpertFloats(lora.parameters(), layer);
    const ExpertTraffic traffic{
        .move_bytes = (base_floats + 4 * lora_floats) * int64_t{sizeof(float)},
        .replica_bytes = (base_floats + 2 * lora_floats) * int64_t{sizeof(float)}};
    StepLoad step;
    absl::StatusOr<BalancePlan> plan =
        Plan(absl::MakeConstSpan(*load).subspan(static_cast<size_t>(layer) * model.num_experts,
                                                model.num_experts),
             now, *agreed, traffic, ranks.size() / group.size(), step);
    before.push_back(MaxOverMean(HomeRankTokens(step, 0, now.Owners(), now.ranks())));
    if (!plan.ok()) {
      // Every rank plans from the same load and placement: all keep it alike.
      spdlog::warn("MoE layer {} keeps its expert placement for this step: {}", layer,
                   plan.status().ToString());
      owners.layers.push_back(now);
      replicated.layers.push_back(now);
      after.push_back(before.back());
      continue;
    }
    rebalanced.experts_moved += plan->experts_moved;
    rebalanced.bytes_moved += plan->experts_moved * traffic.move_bytes;
    owners.layers.push_back(PlacementOf(*plan, now));
    std::optional<ExpertPlacement> copies = ReplicasOf(*plan, owners.layers.back());
    // Every rank plans alike; a plan this code cannot follow is a bug to report, not a crash.
    if (copies.has_value()) {
      if (absl::Status valid = ValidatePlacement(*copies, model.num_experts, group.size());
          !valid.ok()) {
        spdlog::warn("MoE layer {} drops the step's replicas: {}", layer, valid.ToString());
        copies.reset();
      }
    }
    // Without the planned replicas (dropped above), each expert computes all its rows at home.
    after.push_back(copies.has_value()
                        ? MaxOverMean(plan->micro_batches[0].rank_tokens)
                        : MaxOverMean(HomeRankTokens(step, 0, plan->home, now.ranks())));
    replicated.layers.push_back(copies.value_or(owners.layers.back()));
    for (const std::vector<int>& held : replicated.layers.back().replicas) {
      rebalanced.replicas_made += static_cast<int>(held.size());
      rebalanced.bytes_moved +=
          static_cast<int64_t>(held.size()) * traffic.replica_bytes * ReplicaHolds(*agreed);
    }
  }
  rebalanced.before = Summarize(before);
  rebalanced.after = Summarize(after);
  if (owners != current) {
    if (absl::Status status = ChangePlacement(group, exchange, owners, base, lora, optimizer);
        !status.ok()) {
      return status;
    }
  }
  if (replicated.has_replicas()) rebalanced.replicas = std::move(replicated);
  return rebalanced;
}

}  // namespace tandem::placement
