#ifndef TANDEM_SERVICES_TRAINER_STORE_OUTAGE_H_
#define TANDEM_SERVICES_TRAINER_STORE_OUTAGE_H_

#include <atomic>
#include <functional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace tandem::trainer {

struct OutagePolicy {
  absl::Duration initial_backoff = absl::Milliseconds(500);
  absl::Duration max_backoff = absl::Seconds(5);
  // How long a store may stay unavailable before the call fails, naming the store and the time.
  absl::Duration budget = absl::Seconds(60);
};

// Calls `call` (with its attempt number, from 0) until it returns anything but UNAVAILABLE
// (restarting, unreachable) or RESOURCE_EXHAUSTED (a full disk, a busy store), both expected to
// pass; waits between attempts, doubling from policy.initial_backoff up to max_backoff. Returns
// that result; the last failure with the outage's length in its message once the next wait
// would pass the budget; CANCELLED once `cancelled` is set (looked at during waits, too).
absl::Status RideOutOutage(absl::string_view store, const OutagePolicy& policy,
                           const std::atomic<bool>& cancelled, Clock& clock,
                           const std::function<absl::Status(int attempt)>& call);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_STORE_OUTAGE_H_
