#include "services/trainer/job/store_outage.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace tandem::trainer {
namespace {

// How often a wait looks whether the run was cancelled.
constexpr absl::Duration kCancelCheckInterval = absl::Milliseconds(50);

absl::Status Cancelled() { return absl::CancelledError("job cancelled"); }

}  // namespace

absl::Status RideOutOutage(absl::string_view store, const OutagePolicy& policy,
                           const std::atomic<bool>& cancelled, Clock& clock,
                           const std::function<absl::Status(int attempt)>& call) {
  const absl::Time start = clock.Now();
  absl::Duration backoff = std::min(policy.initial_backoff, policy.max_backoff);
  for (int attempt = 0;; ++attempt) {
    if (cancelled) return Cancelled();
    absl::Status status = call(attempt);
    if (!absl::IsUnavailable(status) && !absl::IsResourceExhausted(status)) return status;
    const absl::Duration down = clock.Now() - start;
    if (down + backoff > policy.budget) {
      return absl::Status(status.code(),
                          absl::StrCat(store, " unavailable for ",
                                       absl::FormatDuration(absl::Trunc(down, absl::Seconds(1))),
                                       " (outage budget ", absl::FormatDuration(policy.budget),
                                       "): ", status.message()));
    }
    spdlog::warn("{} unavailable ({}); retrying in {}", store, status.message(),
                 absl::FormatDuration(backoff));
    // Sliced, so a cancel does not wait out the backoff.
    for (const absl::Time until = clock.Now() + backoff; clock.Now() < until && !cancelled;) {
      clock.SleepFor(std::min(until - clock.Now(), kCancelCheckInterval));
    }
    backoff = std::min(backoff * 2, policy.max_backoff);
  }
}

}  // namespace tandem::trainer
