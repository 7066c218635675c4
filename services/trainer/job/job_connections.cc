#include "services/trainer/job/job_connections.h"

#include <utility>

#include "absl/strings/str_join.h"
#include "common/logging.h"

namespace tandem::trainer {

absl::StatusOr<std::unique_ptr<JobConnections>> JobConnections::Dial(
    const ServiceEndpoints& endpoints, ServiceDialer& dialer, absl::string_view job_id,
    bool replays_routes) {
  absl::StatusOr<std::vector<std::string>> addresses = RolloutReplicas(endpoints);
  if (!addresses.ok()) return addresses.status();
  if (!endpoints.rollout_service.empty()) {
    spdlog::info("job {}: rollout replicas of {}: {}", job_id, endpoints.rollout_service,
                 absl::StrJoin(*addresses, ", "));
  }
  std::unique_ptr<JobConnections> connections(new JobConnections());
  for (const std::string& address : *addresses) {
    auto stub = dialer.Rollout(address);
    if (!stub.ok()) return stub.status();
    connections->rollouts_.push_back(*std::move(stub));
    connections->replicas_.push_back(
        {.address = address, .stub = connections->rollouts_.back().get()});
  }
  auto weight_store = dialer.WeightStore(endpoints.weight_store);
  if (!weight_store.ok()) return weight_store.status();
  connections->weight_store_ = *std::move(weight_store);
  if (!endpoints.router_replay.empty()) {
    auto router_replay = dialer.RouterReplay(endpoints.router_replay);
    if (!router_replay.ok()) return router_replay.status();
    connections->router_replay_ = *std::move(router_replay);
    connections->route_source_ =
        std::make_unique<router_replay::RouterReplaySource>(*connections->router_replay_);
  } else if (replays_routes) {
    return absl::FailedPreconditionError(
        "the job replays routes (R3), and this trainer rank has no --router_replay");
  }
  return connections;
}

}  // namespace tandem::trainer
