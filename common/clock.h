#ifndef TANDEM_COMMON_CLOCK_H_
#define TANDEM_COMMON_CLOCK_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tandem {

// Time as a core reads it: the real clock in the services, a simulated one (testing/
// simulated_clock.h) in unit tests, so that timeouts, expiry and backoff are tested without
// waiting in real time. Thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() = 0;
  virtual void SleepFor(absl::Duration duration) = 0;

  static Clock& Real();
};

class RealClock final : public Clock {
 public:
  absl::Time Now() override { return absl::Now(); }
  void SleepFor(absl::Duration duration) override { absl::SleepFor(duration); }
};

inline Clock& Clock::Real() {
  static RealClock clock;
  return clock;
}

}  // namespace tandem

#endif  // TANDEM_COMMON_CLOCK_H_
