#include "services/router_replay/balance_query.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status.h"
#include "placement/balance_planner.h"
#include "placement/eplb.h"

namespace tandem::router_replay {
namespace {

// INVALID_ARGUMENT about the PlanBalanceRequest field at `field`.
absl::Status Invalid(absl::string_view field, auto&&... parts) {
  return InvalidField(field, absl::StrCat(parts...));
}

// The checks placement::PlanBalance leaves to its callers: sizes that bound the work, and the
// fields' own ranges (placement::PlanBalance checks how they fit together).
absl::Status CheckRequest(const routerreplay::v1::PlanBalanceRequest& request) {
  if (request.micro_batches() < 1) return Invalid("micro_batches", "micro_batches must be >= 1");
  if (request.num_experts() < 1) return Invalid("num_experts", "num_experts must be >= 1");
  const int64_t entries = int64_t{request.micro_batches()} * request.num_experts();
  if (entries > placement::kMaxPlanEntries) {
    return Invalid("tokens", "micro_batches * num_experts is ", entries, "; at most ",
                   placement::kMaxPlanEntries);
  }
  if (request.tokens_size() != entries) {
    return Invalid("tokens", "tokens has ", request.tokens_size(),
                   " entries; micro_batches * num_experts = ", entries);
  }
  if (request.ranks() < 1 || request.ranks_per_node() < 1) {
    return Invalid(request.ranks() < 1 ? "ranks" : "ranks_per_node",
                   "ranks and ranks_per_node must be >= 1");
  }
  if (request.has_replica_slots_per_rank() &&
      (request.replica_slots_per_rank() < 0 ||
       request.replica_slots_per_rank() > request.num_experts())) {
    return Invalid("replica_slots_per_rank", "replica_slots_per_rank is ",
                   request.replica_slots_per_rank(), "; 0..", request.num_experts());
  }
  if (!std::isfinite(request.move_cost_tokens()) || request.move_cost_tokens() < 0) {
    return Invalid("move_cost_tokens", "move_cost_tokens must be finite and >= 0");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<routerreplay::v1::PlanBalanceResponse> PlanStepBalance(
    const routerreplay::v1::PlanBalanceRequest& request) {
  if (absl::Status status = CheckRequest(request); !status.ok()) return status;
  const placement::StepLoad load{.micro_batches = request.micro_batches(),
                                 .experts = request.num_experts(),
                                 .tokens = {request.tokens().begin(), request.tokens().end()}};
  const placement::EpTopology topology{
      .ranks = request.ranks(),
      .ranks_per_node = request.ranks_per_node(),
      .replica_slots_per_rank =
          request.has_replica_slots_per_rank() ? request.replica_slots_per_rank() : 2};
  const std::vector<int> current(request.current_home().begin(), request.current_home().end());
  absl::StatusOr<placement::BalancePlan> plan = placement::PlanBalance(
      load, topology, current, {.move_cost_tokens = request.move_cost_tokens()});
  if (!plan.ok()) return plan.status();
  routerreplay::v1::PlanBalanceResponse response;
  response.mutable_home()->Add(plan->home.begin(), plan->home.end());
  response.set_experts_moved(plan->experts_moved);
  for (int m = 0; m < load.micro_batches; ++m) {
    const placement::MicroBatchPlan& planned = plan->micro_batches[m];
    routerreplay::v1::PlanBalanceResponse::MicroBatch& batch = *response.add_micro_batches();
    for (const placement::ExpertCopy& copy : planned.copies) {
      routerreplay::v1::PlanBalanceResponse::ExpertCopy& out = *batch.add_copies();
      out.set_expert(copy.expert);
      out.set_rank(copy.rank);
      out.set_tokens(copy.tokens);
    }
    batch.mutable_rank_tokens()->Add(planned.rank_tokens.begin(), planned.rank_tokens.end());
    batch.set_imbalance_before(
        placement::MaxOverMean(placement::HomeRankTokens(load, m, current, topology.ranks)));
    batch.set_imbalance_after(placement::MaxOverMean(planned.rank_tokens));
  }
  return response;
}

}  // namespace tandem::router_replay
