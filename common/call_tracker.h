#ifndef TANDEM_COMMON_CALL_TRACKER_H_
#define TANDEM_COMMON_CALL_TRACKER_H_

#include <memory>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tandem {

// Counts a service's calls in progress so its drain can wait for them to end on their own
// before the server shuts down (which closes connections a client may still be reading from).
class CallTracker {
 public:
  // Held by a call for as long as it runs (e.g. a member of its reactor).
  class Token {
   public:
    explicit Token(CallTracker& tracker) : tracker_(tracker) {
      absl::MutexLock lock(&tracker_.mutex_);
      ++tracker_.active_;
    }
    ~Token() {
      absl::MutexLock lock(&tracker_.mutex_);
      --tracker_.active_;
    }
    Token(const Token&) = delete;
    Token& operator=(const Token&) = delete;

   private:
    CallTracker& tracker_;
  };

  // True once no call is in progress; false if some still are after `timeout`.
  bool WaitUntilIdle(absl::Duration timeout) {
    absl::MutexLock lock(&mutex_);
    const auto idle = [this] {
      mutex_.AssertHeld();
      return active_ == 0;
    };
    return mutex_.AwaitWithTimeout(absl::Condition(&idle), timeout);
  }

 private:
  absl::Mutex mutex_;
  int active_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_CALL_TRACKER_H_
