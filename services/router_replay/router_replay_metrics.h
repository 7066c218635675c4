#ifndef TANDEM_SERVICES_ROUTER_REPLAY_ROUTER_REPLAY_METRICS_H_
#define TANDEM_SERVICES_ROUTER_REPLAY_ROUTER_REPLAY_METRICS_H_

#include <cstdint>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "services/router_replay/route_codec.h"
#include "services/router_replay/route_store.h"

namespace tandem::router_replay {

// The router-replay service's Prometheus series (process-wide, in MetricsRegistry()).
class RouterReplayMetrics {
 public:
  static RouterReplayMetrics& Get();

  // One stored chunk: raw int16 bytes received vs encoded bytes written.
  void RecordAppend(const RouteShape& shape, const AppendOutcome& outcome);
  void RecordFetch(int64_t rows, int64_t bytes);
  void RecordDeleted(int64_t records, bool by_ttl);
  void RecordTotals(const StoreTotals& totals);

  prometheus::Histogram& append_chunk_seconds;
  prometheus::Histogram& sync_seconds;

 private:
  RouterReplayMetrics();

  prometheus::Counter& appended_rows_;
  prometheus::Counter& appended_bytes_;
  prometheus::Counter& stored_packed_bytes_;
  prometheus::Counter& stored_zstd_bytes_;
  prometheus::Gauge& compression_ratio_;
  prometheus::Counter& fetched_rows_;
  prometheus::Counter& fetched_bytes_;
  prometheus::Counter& deleted_by_request_;
  prometheus::Counter& deleted_by_ttl_;
  prometheus::Gauge& open_records_;
  prometheus::Gauge& sealed_records_;
  prometheus::Gauge& held_bytes_;
};

}  // namespace tandem::router_replay

#endif  // TANDEM_SERVICES_ROUTER_REPLAY_ROUTER_REPLAY_METRICS_H_
