#ifndef TANDEM_SERVICES_TRAINER_SERVICE_ENDPOINTS_H_
#define TANDEM_SERVICES_TRAINER_SERVICE_ENDPOINTS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tandem/trainer/v1/trainer.pb.h"

namespace tandem::trainer {

// Fills the endpoints a job spec leaves empty from the trainer's defaults (its flags), field by
// field; rollout and rollout_service count as one field. See trainer.proto's ServiceEndpoints.
void ApplyDefaultEndpoints(const trainer::v1::ServiceEndpoints& defaults, trainer::v1::ServiceEndpoints& endpoints);

// OK when `name_port` is "name:port" with a non-empty name and a port in 1..65535; otherwise
// INVALID_ARGUMENT saying which part is wrong.
absl::Status CheckServiceName(absl::string_view name_port);

// The rollout replicas of `endpoints`: its rollout list, or one "address:port" per address that
// rollout_service's name resolves to now (sorted, no repeats; IPv6 as "[address]:port").
// UNAVAILABLE naming the Service when it resolves to no address; FAILED_PRECONDITION when it
// resolves to more than 256.
absl::StatusOr<std::vector<std::string>> RolloutReplicas(const trainer::v1::ServiceEndpoints& endpoints);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_SERVICE_ENDPOINTS_H_
