#ifndef TANDEM_SERVICES_TRAINER_SERVICE_ENDPOINTS_H_
#define TANDEM_SERVICES_TRAINER_SERVICE_ENDPOINTS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::trainer {

// Where a trainer's jobs find the other services: the operator's configuration (the trainer's
// --rollout or --rollout_service, --weight_store and --router_replay flags, which the Helm chart
// sets), never the job spec's. Addresses are "host:port", "dns:///name:port" or "unix:/path".
struct ServiceEndpoints {
  std::vector<std::string> rollout;  // Rollout replicas; exclusive with rollout_service.
  // "name:port" of a headless Service: every address the name resolves to when a job starts or
  // resumes is one rollout replica (so scaling the rollout needs no new job).
  std::string rollout_service;
  std::string weight_store;
  std::string router_replay;  // Empty: jobs cannot use R3 routing replay.
};

// OK when the endpoints can run jobs: rollout replicas (1..256 non-empty addresses, or a
// rollout_service "name:port") and a weight-store; INVALID_ARGUMENT naming the flag otherwise.
absl::Status CheckServiceEndpoints(const ServiceEndpoints& endpoints);

// OK when `name_port` is "name:port" with a non-empty name and a port in 1..65535; otherwise
// INVALID_ARGUMENT saying which part is wrong.
absl::Status CheckServiceName(absl::string_view name_port);

// The rollout replicas: the rollout list, or one "address:port" per address that
// rollout_service's name resolves to now (sorted, no repeats; IPv6 as "[address]:port").
// UNAVAILABLE naming the Service when it resolves to no address; FAILED_PRECONDITION when it
// resolves to more than 256.
absl::StatusOr<std::vector<std::string>> RolloutReplicas(const ServiceEndpoints& endpoints);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_SERVICE_ENDPOINTS_H_
