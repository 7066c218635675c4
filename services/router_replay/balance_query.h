#ifndef TANDEM_SERVICES_ROUTER_REPLAY_BALANCE_QUERY_H_
#define TANDEM_SERVICES_ROUTER_REPLAY_BALANCE_QUERY_H_

#include "absl/status/statusor.h"
#include "tandem/routerreplay/v1/router_replay.pb.h"

namespace tandem::router_replay {

// PlanBalance's work: checks the request (router_replay.proto's rules, INVALID_ARGUMENT naming
// the field), plans with PlanBalance (placement/balance_planner.h) and converts the plan.
absl::StatusOr<routerreplay::v1::PlanBalanceResponse> PlanStepBalance(
    const routerreplay::v1::PlanBalanceRequest& request);

}  // namespace tandem::router_replay

#endif  // TANDEM_SERVICES_ROUTER_REPLAY_BALANCE_QUERY_H_
