#ifndef TANDEM_SERVICES_ROUTER_REPLAY_RETENTION_SWEEPER_H_
#define TANDEM_SERVICES_ROUTER_REPLAY_RETENTION_SWEEPER_H_

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/periodic_thread.h"
#include "services/router_replay/route_store.h"

namespace tandem::router_replay {

// Deletes records untouched for longer than the TTL, every `interval`, on its own thread.
class RetentionSweeper {
 public:
  // ttl must be positive; the store must outlive the sweeper.
  RetentionSweeper(RouteStore& store, absl::Duration ttl, absl::Duration interval);

  // One sweep now; returns how many records it deleted.
  absl::StatusOr<int64_t> SweepOnce();

 private:
  void Sweep();

  RouteStore& store_;
  const absl::Duration ttl_;
  PeriodicThread thread_;  // Last: stops before the members above go.
};

}  // namespace tandem::router_replay

#endif  // TANDEM_SERVICES_ROUTER_REPLAY_RETENTION_SWEEPER_H_
