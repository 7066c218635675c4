#include "services/router_replay/retention_sweeper.h"

#include "common/logging.h"
#include "services/router_replay/router_replay_metrics.h"

namespace tandem::router_replay {

RetentionSweeper::RetentionSweeper(RouteStore& store, absl::Duration ttl, absl::Duration interval)
    : store_(store), ttl_(ttl), thread_(interval, [this] { Sweep(); }) {}

absl::StatusOr<int64_t> RetentionSweeper::SweepOnce() {
  absl::StatusOr<DeleteOutcome> deleted = store_.DeleteUpdatedBefore(store_.clock().Now() - ttl_);
  if (!deleted.ok()) return deleted.status();
  RouterReplayMetrics::Get().RecordDeleted(deleted->records, /*by_ttl=*/true);
  RouterReplayMetrics::Get().RecordTotals(store_.totals());
  return deleted->records;
}

void RetentionSweeper::Sweep() {
  absl::StatusOr<int64_t> deleted = SweepOnce();
  if (!deleted.ok()) {
    spdlog::warn("retention sweep failed: {}", deleted.status());
  } else if (*deleted > 0) {
    spdlog::info("retention sweep deleted {} records older than {}", *deleted,
                 absl::FormatDuration(ttl_));
  }
}

}  // namespace tandem::router_replay
