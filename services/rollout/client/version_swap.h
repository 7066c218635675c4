#ifndef TANDEM_SERVICES_ROLLOUT_CLIENT_VERSION_SWAP_H_
#define TANDEM_SERVICES_ROLLOUT_CLIENT_VERSION_SWAP_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "services/rollout/client/sample_fan_out.h"

namespace tandem::rollout {

struct VersionSwapOptions {
  absl::Duration timeout = absl::Seconds(60);  // For all replicas together.
  // Only for a replica that predates WatchAdapterStatus, which is asked with GetAdapterStatus:
  // again after poll_initial, then twice as long each time up to poll_max (a local swap takes
  // milliseconds, a remote one over a slow link seconds, and neither wants a 2 ms RPC loop).
  absl::Duration poll_initial = absl::Milliseconds(1);
  absl::Duration poll_max = absl::Milliseconds(50);
  absl::Duration rpc_timeout = absl::Seconds(10);  // Per GetAdapterStatus call.
};

// Waits until every replica serves `version` (or newer) of `adapter` for new requests, as each
// replica tells it on its WatchAdapterStatus stream: the swap is pushed, not polled for. (A
// replica that predates the watch, UNIMPLEMENTED, is polled.) A replica that does not follow the
// adapter (NOT_FOUND) or is restarting (UNAVAILABLE) loads the version on first use and is not
// waited for. Returns DEADLINE_EXCEEDED naming the replica and its adapter's last error once
// options.timeout has passed, or the error of a call that failed otherwise.
absl::Status AwaitVersionServed(absl::Span<const ReplicaStub> replicas, const std::string& adapter,
                                int64_t version, const VersionSwapOptions& options, Clock& clock);

}  // namespace tandem::rollout

#endif  // TANDEM_SERVICES_ROLLOUT_CLIENT_VERSION_SWAP_H_
