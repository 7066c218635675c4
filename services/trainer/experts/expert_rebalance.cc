#include "services/trainer/experts/expert_rebalance.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <vector>

#include "common/logging.h"
#include "common/status.h"
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

absl::StatusOr<routerreplay::v1::PlanBalanceResponse> Plan(
    routerreplay::v1::RouterReplayService::StubInterface& planner, const std::vector<float>& load,
    const engine::ExpertPlacement& placement, absl::Duration timeout) {
  routerreplay::v1::PlanBalanceRequest request;
  request.set_micro_batches(1);
  request.set_num_experts(static_cast<int>(load.size()));
  double total = 0;
  for (float rows : load) {
    request.add_tokens(static_cast<int64_t>(rows));
    total += rows;
  }
  request.set_ranks(placement.ranks());
  request.set_ranks_per_node(placement.ranks());
  request.set_replica_slots_per_rank(kReplicaSlotsPerRank);
  for (int rank : placement.Owners()) request.add_current_home(rank);
  request.set_move_cost_tokens(total / (10.0 * static_cast<double>(load.size())));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  routerreplay::v1::PlanBalanceResponse response;
  if (absl::Status status = FromGrpcStatus(planner.PlanBalance(&context, request, &response));
      !status.ok()) {
    return status;
  }
  if (response.home_size() != request.num_experts() || response.micro_batches_size() != 1) {
    return absl::InternalError("router-replay's PlanBalance answered a plan of another shape");
  }
  return response;
}

// `home`'s placement: each rank keeps the experts it holds and stays their home, in their order,
// and takes the experts coming to it after them, in id order.
engine::ExpertPlacement PlacementOf(const routerreplay::v1::PlanBalanceResponse& plan,
                                    const engine::ExpertPlacement& current) {
  engine::ExpertPlacement next;
  for (int rank = 0; rank < current.ranks(); ++rank) {
    std::vector<int>& held = next.experts.emplace_back();
    for (int expert : current.experts[rank]) {
      if (plan.home(expert) == rank) held.push_back(expert);
    }
    for (int expert = 0; expert < plan.home_size(); ++expert) {
      if (plan.home(expert) == rank && std::find(held.begin(), held.end(), expert) == held.end()) {
        held.push_back(expert);
      }
    }
  }
  return next;
}

// `owners` (the plan's homes) with the plan's replicas: every copy of a replicated expert that is
// not its home, its share the copy's planned tokens (at least 1). Nullopt without replicas.
std::optional<engine::ExpertPlacement> ReplicasOf(const routerreplay::v1::PlanBalanceResponse& plan,
                                                  const engine::ExpertPlacement& owners) {
  std::map<int, std::map<int, int64_t>> tokens;  // Expert -> copy's rank -> its tokens.
  for (const auto& copy : plan.micro_batches(0).copies()) {
    if (copy.expert() < 0 || copy.expert() >= plan.home_size() || copy.rank() < 0 ||
        copy.rank() >= owners.ranks()) {
      spdlog::warn("router-replay planned a copy of expert {} on rank {}: no replicas this step",
                   copy.expert(), copy.rank());
      return std::nullopt;
    }
    tokens[copy.expert()][copy.rank()] = copy.tokens();
  }
  engine::ExpertPlacement replicated = owners;
  replicated.replicas.assign(owners.ranks(), {});
  for (const auto& [expert, by_rank] : tokens) {
    const int home = plan.home(expert);
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

absl::StatusOr<Rebalanced> RebalanceExperts(
    Communicator& ranks, Communicator& group, engine::ExpertParallelExchange& exchange,
    const std::vector<int16_t>& routes,
    routerreplay::v1::RouterReplayService::StubInterface& planner, absl::Duration timeout,
    engine::BaseModel& base, engine::LoraAdapter& lora, engine::AdamW& optimizer) {
  // Every group plans from the whole job's load, so all take the same placement and the copies
  // of an expert stay on the same group rank (their gradients are summed over the copies).
  absl::StatusOr<std::vector<float>> load = StepLoad(ranks, routes, base.config().num_experts);
  if (!load.ok()) return load.status();
  const engine::ExpertPlacement current = exchange.placement();
  absl::StatusOr<routerreplay::v1::PlanBalanceResponse> plan =
      Plan(planner, *load, current, timeout);
  if (absl::Status agreed =
          AgreeOnFailures(ranks, plan.status(), "to plan the step's expert placement", timeout);
      !agreed.ok()) {
    if (IsBrokenGroup(agreed)) return agreed;
    spdlog::warn("expert placement kept for this step: {}", agreed.ToString());
    return Rebalanced{};
  }
  Rebalanced rebalanced{.experts_moved = plan->experts_moved(),
                        .imbalance_before = plan->micro_batches(0).imbalance_before(),
                        .imbalance_after = plan->micro_batches(0).imbalance_after()};
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
