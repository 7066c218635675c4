#include "services/router_replay/router_replay_metrics.h"

#include "common/metrics.h"

namespace tandem::router_replay {
namespace {

prometheus::Family<prometheus::Counter>& CounterFamily(const char* name, const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(MetricsRegistry());
}

prometheus::Family<prometheus::Gauge>& GaugeFamily(const char* name, const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(MetricsRegistry());
}

}  // namespace

RouterReplayMetrics& RouterReplayMetrics::Get() {
  static auto* metrics = new RouterReplayMetrics();
  return *metrics;
}

RouterReplayMetrics::RouterReplayMetrics()
    : append_chunk_seconds(LatencyHistogram("tandem_router_replay_append_chunk_seconds",
                                            "Time to validate, encode and store one chunk.")),
      sync_seconds(LatencyHistogram("tandem_router_replay_sync_seconds",
                                    "Time to make an Append stream durable before its reply.")),
      appended_rows_(CounterFamily("tandem_router_replay_appended_tokens_total",
                                   "Route rows (tokens) newly stored; retries not counted.")
                         .Add({})),
      appended_bytes_(CounterFamily("tandem_router_replay_appended_bytes_total",
                                    "Newly stored routes as int16 bytes (the wire size).")
                          .Add({})),
      stored_packed_bytes_(CounterFamily("tandem_router_replay_stored_bytes_total",
                                         "Encoded bytes written, by block encoding.")
                               .Add({{"encoding", "packed"}})),
      stored_zstd_bytes_(CounterFamily("tandem_router_replay_stored_bytes_total",
                                       "Encoded bytes written, by block encoding.")
                             .Add({{"encoding", "packed_zstd"}})),
      compression_ratio_(GaugeFamily("tandem_router_replay_compression_ratio",
                                     "int16 bytes appended / encoded bytes written, since start.")
                             .Add({})),
      fetched_rows_(CounterFamily("tandem_router_replay_fetched_tokens_total",
                                  "Route rows (tokens) sent by FetchRoutes.")
                        .Add({})),
      fetched_bytes_(CounterFamily("tandem_router_replay_fetched_bytes_total",
                                   "Route bytes (int16) sent by FetchRoutes.")
                         .Add({})),
      deleted_by_request_(
          CounterFamily("tandem_router_replay_deleted_records_total", "Records deleted, by reason.")
              .Add({{"reason", "request"}})),
      deleted_by_ttl_(
          CounterFamily("tandem_router_replay_deleted_records_total", "Records deleted, by reason.")
              .Add({{"reason", "ttl"}})),
      open_records_(GaugeFamily("tandem_router_replay_records", "Records held, by state.")
                        .Add({{"state", "open"}})),
      sealed_records_(GaugeFamily("tandem_router_replay_records", "Records held, by state.")
                          .Add({{"state", "sealed"}})),
      held_bytes_(
          GaugeFamily("tandem_router_replay_held_bytes", "Encoded bytes of the records held.")
              .Add({})) {}

void RouterReplayMetrics::RecordAppend(const RouteShape& shape, const AppendOutcome& outcome) {
  if (outcome.new_rows == 0) return;
  appended_rows_.Increment(static_cast<double>(outcome.new_rows));
  appended_bytes_.Increment(
      static_cast<double>(outcome.new_rows * shape.ids_per_row() * sizeof(int16_t)));
  (outcome.encoding == BlockEncoding::kPackedZstd ? stored_zstd_bytes_ : stored_packed_bytes_)
      .Increment(static_cast<double>(outcome.stored_bytes));
  const double stored = stored_packed_bytes_.Value() + stored_zstd_bytes_.Value();
  if (stored > 0) compression_ratio_.Set(appended_bytes_.Value() / stored);
}

void RouterReplayMetrics::RecordFetch(int64_t rows, int64_t bytes) {
  fetched_rows_.Increment(static_cast<double>(rows));
  fetched_bytes_.Increment(static_cast<double>(bytes));
}

void RouterReplayMetrics::RecordDeleted(int64_t records, bool by_ttl) {
  (by_ttl ? deleted_by_ttl_ : deleted_by_request_).Increment(static_cast<double>(records));
}

void RouterReplayMetrics::RecordTotals(const StoreTotals& totals) {
  open_records_.Set(static_cast<double>(totals.open_records));
  sealed_records_.Set(static_cast<double>(totals.sealed_records));
  held_bytes_.Set(static_cast<double>(totals.stored_bytes));
}

}  // namespace tandem::router_replay
