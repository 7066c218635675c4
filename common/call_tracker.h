#ifndef TANDEM_COMMON_CALL_TRACKER_H_
#define TANDEM_COMMON_CALL_TRACKER_H_

#include <functional>
#include <memory>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tandem {

// Counts a service's calls of one kind in progress: so its drain can wait for them to end on
// their own before the server shuts down (which closes connections a client may still be
// reading from), and so their number can be bounded (each holds memory while a client reads).
class CallTracker {
 public:
  // `on_idle` runs (outside the lock) each time the last call in progress ends; the tracker must
  // outlive every token (a reactor holding one is done before its service is destroyed).
  explicit CallTracker(std::function<void()> on_idle = nullptr) : on_idle_(std::move(on_idle)) {}

  // Held by a call for as long as it runs (e.g. a member of its reactor).
  class Token {
   public:
    explicit Token(CallTracker& tracker) : tracker_(tracker) {
      absl::MutexLock lock(&tracker_.mutex_);
      ++tracker_.active_;
    }
    ~Token() { tracker_.Leave(); }
    Token(const Token&) = delete;
    Token& operator=(const Token&) = delete;

   private:
    friend class CallTracker;
    struct Counted {};
    Token(CallTracker& tracker, Counted) : tracker_(tracker) {}
    CallTracker& tracker_;
  };

  // A token when fewer than `max` calls are in progress; null otherwise.
  std::unique_ptr<Token> TryEnter(int max) {
    {
      absl::MutexLock lock(&mutex_);
      if (active_ >= max) return nullptr;
      ++active_;
    }
    return std::unique_ptr<Token>(new Token(*this, Token::Counted{}));
  }

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
  void Leave() {
    bool idle = false;
    {
      absl::MutexLock lock(&mutex_);
      idle = --active_ == 0;
    }
    if (idle && on_idle_) on_idle_();
  }

  const std::function<void()> on_idle_;
  absl::Mutex mutex_;
  int active_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_CALL_TRACKER_H_
