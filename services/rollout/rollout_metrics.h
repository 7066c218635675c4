#ifndef TANDEM_SERVICES_ROLLOUT_ROLLOUT_METRICS_H_
#define TANDEM_SERVICES_ROLLOUT_ROLLOUT_METRICS_H_

#include <string>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"

namespace tandem::rollout {

// The rollout's Prometheus series (process-wide, in MetricsRegistry()).
struct RolloutMetrics {
  static RolloutMetrics& Get();

  prometheus::Counter& tokens_generated;
  prometheus::Counter& samples;
  prometheus::Counter& routes_rows_sent;
  prometheus::Counter& route_failures;
  prometheus::Gauge& batch_occupancy;      // Sequences in the decode batch.
  prometheus::Gauge& kv_cache_used_bytes;  // Reserved by admitted sequences.
  prometheus::Gauge& kv_cache_budget_bytes;
  prometheus::Gauge& queued_tokens;  // Reserved by samples waiting for admission.
  prometheus::Histogram& time_to_first_token_seconds;
  prometheus::Histogram& decode_step_seconds;              // One decode step: per-token latency.
  prometheus::Histogram& adapter_swap_seconds;             // Version announced to servable.
  prometheus::Family<prometheus::Gauge>& adapter_version;  // Current version by adapter.
  prometheus::Family<prometheus::Counter>& adapter_fetches;  // By source: store or relay.

 private:
  RolloutMetrics();
};

}  // namespace tandem::rollout

#endif  // TANDEM_SERVICES_ROLLOUT_ROLLOUT_METRICS_H_
