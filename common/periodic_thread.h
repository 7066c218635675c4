#ifndef TANDEM_COMMON_PERIODIC_THREAD_H_
#define TANDEM_COMMON_PERIODIC_THREAD_H_

#include <functional>
#include <thread>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tandem {

// Runs `tick` every `interval` on its own thread until destroyed; destruction wakes the thread
// at once and joins it (a tick in progress finishes first).
class PeriodicThread {
 public:
  PeriodicThread(absl::Duration interval, std::function<void()> tick)
      : interval_(interval), tick_(std::move(tick)), thread_([this] { Run(); }) {}

  ~PeriodicThread() {
    {
      absl::MutexLock lock(&mutex_);
      stopping_ = true;
    }
    thread_.join();
  }

 private:
  void Run() {
    absl::MutexLock lock(&mutex_);
    while (!mutex_.AwaitWithTimeout(absl::Condition(&stopping_), interval_)) {
      mutex_.Unlock();
      tick_();
      mutex_.Lock();
    }
  }

  const absl::Duration interval_;
  const std::function<void()> tick_;
  absl::Mutex mutex_;
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread thread_;  // Last: starts once everything above is initialized.
};

}  // namespace tandem

#endif  // TANDEM_COMMON_PERIODIC_THREAD_H_
