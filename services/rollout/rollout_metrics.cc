#include "services/rollout/rollout_metrics.h"

#include "common/metrics.h"

namespace tandem::rollout {
namespace {

prometheus::Counter& Counter(const char* name, const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(MetricsRegistry()).Add({});
}

prometheus::Gauge& Gauge(const char* name, const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(MetricsRegistry()).Add({});
}

}  // namespace

RolloutMetrics& RolloutMetrics::Get() {
  static auto* metrics = new RolloutMetrics();
  return *metrics;
}

RolloutMetrics::RolloutMetrics()
    : tokens_generated(Counter("tandem_rollout_tokens_generated_total", "Tokens sampled.")),
      samples(Counter("tandem_rollout_samples_total", "Samples finished and sent.")),
      routes_rows_sent(Counter("tandem_rollout_route_rows_sent_total",
                               "Route rows (one per forwarded position) queued to router-replay.")),
      route_failures(Counter("tandem_rollout_route_failures_total",
                             "Samples whose routes router-replay did not acknowledge.")),
      batch_occupancy(Gauge("tandem_rollout_batch_sequences", "Sequences in the decode batch.")),
      kv_cache_used_bytes(
          Gauge("tandem_rollout_kv_cache_used_bytes", "KV cache reserved by admitted sequences.")),
      kv_cache_budget_bytes(Gauge("tandem_rollout_kv_cache_budget_bytes", "KV cache budget.")),
      queued_tokens(Gauge("tandem_rollout_queued_tokens",
                          "Positions reserved by samples waiting for admission.")),
      time_to_first_token_seconds(LatencyHistogram("tandem_rollout_time_to_first_token_seconds",
                                                   "Generate call to a sample's first token.")),
      decode_step_seconds(LatencyHistogram("tandem_rollout_decode_step_seconds",
                                           "One decode step of the batch (per-token latency).")),
      adapter_swap_seconds(
          LatencyHistogram("tandem_rollout_adapter_swap_seconds",
                           "From weight-store announcing a version to it serving here.")),
      adapter_version(prometheus::BuildGauge()
                          .Name("tandem_rollout_adapter_version")
                          .Help("Version new requests for the adapter get.")
                          .Register(MetricsRegistry())),
      adapter_fetches(prometheus::BuildCounter()
                          .Name("tandem_rollout_adapter_fetches_total")
                          .Help("Adapter versions fetched, by source: the weight-store, or "
                                "another replica's relay.")
                          .Register(MetricsRegistry())) {}

}  // namespace tandem::rollout
