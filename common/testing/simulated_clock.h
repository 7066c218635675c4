#ifndef TANDEM_COMMON_TESTING_SIMULATED_CLOCK_H_
#define TANDEM_COMMON_TESTING_SIMULATED_CLOCK_H_

#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/clock.h"

namespace tandem::testing {

// A clock that only moves when told to: SleepFor returns at once, having moved time forward by
// the duration (and recorded it), so a unit test runs a minute of backoff in microseconds.
class SimulatedClock final : public Clock {
 public:
  explicit SimulatedClock(absl::Time start = absl::UnixEpoch() + absl::Hours(24)) : now_(start) {}

  absl::Time Now() override {
    absl::MutexLock lock(&mutex_);
    return now_;
  }
  void SleepFor(absl::Duration duration) override {
    absl::MutexLock lock(&mutex_);
    now_ += duration;
    sleeps_.push_back(duration);
  }
  void Advance(absl::Duration duration) {
    absl::MutexLock lock(&mutex_);
    now_ += duration;
  }
  std::vector<absl::Duration> sleeps() const {
    absl::MutexLock lock(&mutex_);
    return sleeps_;
  }

 private:
  mutable absl::Mutex mutex_;
  absl::Time now_ ABSL_GUARDED_BY(mutex_);
  std::vector<absl::Duration> sleeps_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace tandem::testing

#endif  // TANDEM_COMMON_TESTING_SIMULATED_CLOCK_H_
