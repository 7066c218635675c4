#ifndef TANDEM_SERVICES_ROUTER_REPLAY_RETENTION_SWEEPER_H_
#define TANDEM_SERVICES_ROUTER_REPLAY_RETENTION_SWEEPER_H_

#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/router_replay/route_store.h"

namespace tandem::router_replay {

// Deletes records untouched for longer than the TTL, every `interval`, on its own thread.
class RetentionSweeper {
 public:
  // ttl must be positive; the store must outlive the sweeper.
  RetentionSweeper(RouteStore& store, absl::Duration ttl, absl::Duration interval);
  ~RetentionSweeper();  // Stops and joins the thread.

  // One sweep now; returns how many records it deleted.
  absl::StatusOr<int64_t> SweepOnce();

 private:
  void Run();

  RouteStore& store_;
  const absl::Duration ttl_;
  const absl::Duration interval_;
  absl::Mutex mutex_;
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread thread_;
};

}  // namespace tandem::router_replay

#endif  // TANDEM_SERVICES_ROUTER_REPLAY_RETENTION_SWEEPER_H_
