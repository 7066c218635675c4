#ifndef TANDEM_SERVICES_ROLLOUT_STATUS_LISTENERS_H_
#define TANDEM_SERVICES_ROLLOUT_STATUS_LISTENERS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/synchronization/mutex.h"

namespace tandem::rollout {

// Who hears that an adapter's status on this replica changed (WatchAdapterStatus streams). The
// registry notifies after each change, never while holding its own lock, so a listener may read
// the status it was told about. Listeners of one adapter are called one at a time. Thread-safe.
class StatusListeners {
 public:
  struct Listener {
    std::function<void()> on_change;
    std::function<void()> on_end;  // The replica is draining: no more changes will be told.
  };

  // Adds `listener` for `adapter` and calls its on_change once, for the status as it is now.
  // Returns the id that Remove takes.
  int64_t Add(const std::string& adapter, Listener listener);
  // Once it returns, the listener is not called again (idempotent).
  void Remove(int64_t id);

  void Notify(const std::string& adapter);
  // Calls every listener's on_end and forgets them all.
  void EndAll();

 private:
  struct Entry {
    std::string adapter;
    Listener listener;
  };
  absl::Mutex mutex_;
  int64_t next_id_ ABSL_GUARDED_BY(mutex_) = 1;
  std::map<int64_t, Entry> listeners_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace tandem::rollout

#endif  // TANDEM_SERVICES_ROLLOUT_STATUS_LISTENERS_H_
