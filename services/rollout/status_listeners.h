#ifndef TANDEM_SERVICES_ROLLOUT_STATUS_LISTENERS_H_
#define TANDEM_SERVICES_ROLLOUT_STATUS_LISTENERS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace tandem::rollout {

// Who hears that an adapter's status on this replica changed (WatchAdapterStatus streams). The
// registry notifies after each change, never while holding its own lock, so a listener may read
// the status it was told about. Listeners are called one at a time. Thread-safe.
class StatusListeners {
 public:
  struct Listener {
    // Told of a change, and once when added. Returns false once there is nothing more to tell
    // (the adapter is no longer followed): the listener is then removed and ended NOT_FOUND.
    std::function<bool()> on_change;
    // Ends the listener, once, outside the lock: NOT_FOUND (its adapter was unfollowed) or
    // UNAVAILABLE (the replica is draining).
    std::function<void(const absl::Status&)> on_end;
  };

  // Adds `listener` for `adapter` and tells it the status as it is now; once EndAll was called,
  // ends it at once instead. Returns the id that Remove takes.
  int64_t Add(const std::string& adapter, Listener listener);
  // Once it returns, the listener is not called again (idempotent).
  void Remove(int64_t id);

  void Notify(const std::string& adapter);
  // The replica is draining: ends every listener, and every one added from now on.
  void EndAll();

 private:
  struct Entry {
    std::string adapter;
    Listener listener;
  };
  using Ended = std::vector<std::pair<Entry, absl::Status>>;
  // Calls on_change of `id`'s entry; moves the entry to `ended` when it is done.
  void TellLocked(std::map<int64_t, Entry>::iterator it, Ended& ended)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  static void End(Ended& ended);

  absl::Mutex mutex_;
  bool ending_ ABSL_GUARDED_BY(mutex_) = false;
  int64_t next_id_ ABSL_GUARDED_BY(mutex_) = 1;
  std::map<int64_t, Entry> listeners_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace tandem::rollout

#endif  // TANDEM_SERVICES_ROLLOUT_STATUS_LISTENERS_H_
