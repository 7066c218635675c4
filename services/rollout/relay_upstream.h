#ifndef TANDEM_SERVICES_ROLLOUT_RELAY_UPSTREAM_H_
#define TANDEM_SERVICES_ROLLOUT_RELAY_UPSTREAM_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::rollout {

// Where a replica of a relay chain reads adapter versions from (rollout --relay_from): the
// address as given, or, where it holds "{previous}", that placeholder replaced by the index of
// the replica before this one, so that every pod of a StatefulSet is given the same flag. The
// chain's head (replica_index 0) reads from the weight-store: empty. INVALID_ARGUMENT for
// "{previous}" without a replica index >= 0.
absl::StatusOr<std::string> RelayUpstream(absl::string_view relay_from, int replica_index);

}  // namespace tandem::rollout

#endif  // TANDEM_SERVICES_ROLLOUT_RELAY_UPSTREAM_H_
