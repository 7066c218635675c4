#include "services/router_replay/retention_sweeper.h"

#include "common/logging.h"
#include "services/router_replay/router_replay_metrics.h"

namespace tandem::router_replay {

RetentionSweeper::RetentionSweeper(RouteStore& store, absl::Duration ttl, absl::Duration interval)
    : store_(store), ttl_(ttl), interval_(interval), thread_([this] { Run(); }) {}

RetentionSweeper::~RetentionSweeper() {
  {
    absl::MutexLock lock(&mutex_);
    stopping_ = true;
  }
  thread_.join();
}

absl::StatusOr<int64_t> RetentionSweeper::SweepOnce() {
  absl::StatusOr<DeleteOutcome> deleted = store_.DeleteUpdatedBefore(absl::Now() - ttl_);
  if (!deleted.ok()) return deleted.status();
  RouterReplayMetrics::Get().RecordDeleted(deleted->records, /*by_ttl=*/true);
  RouterReplayMetrics::Get().RecordTotals(store_.totals());
  return deleted->records;
}

void RetentionSweeper::Run() {
  absl::MutexLock lock(&mutex_);
  while (!mutex_.AwaitWithTimeout(absl::Condition(&stopping_), interval_)) {
    mutex_.Unlock();
    absl::StatusOr<int64_t> deleted = SweepOnce();
    if (!deleted.ok()) {
      spdlog::warn("retention sweep failed: {}", deleted.status());
    } else if (*deleted > 0) {
      spdlog::info("retention sweep deleted {} records older than {}", *deleted,
                   absl::FormatDuration(ttl_));
    }
    mutex_.Lock();
  }
}

}  // namespace tandem::router_replay
