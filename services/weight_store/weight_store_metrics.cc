#include "services/weight_store/weight_store_metrics.h"

#include "common/metrics.h"

namespace tandem::weight_store {
namespace {

prometheus::Counter& BytesCounter(const char* name, const char* help, const char* transport) {
  return prometheus::BuildCounter()
      .Name(name)
      .Help(help)
      .Register(MetricsRegistry())
      .Add({{"transport", transport}});
}

prometheus::Gauge& Gauge(const char* name, const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(MetricsRegistry()).Add({});
}

constexpr char kInName[] = "tandem_weight_store_bytes_in_total";
constexpr char kInHelp[] = "Adapter bytes published into the store, by transport.";
constexpr char kOutName[] = "tandem_weight_store_bytes_out_total";
constexpr char kOutHelp[] = "Adapter bytes fetched from the store, by transport.";

}  // namespace

WeightStoreMetrics& WeightStoreMetrics::Get() {
  static auto* metrics = new WeightStoreMetrics();
  return *metrics;
}

WeightStoreMetrics::WeightStoreMetrics()
    : publish_seconds(LatencyHistogram("tandem_weight_store_publish_seconds",
                                       "From BeginPublish to a successful commit.")),
      fetch_seconds(LatencyHistogram("tandem_weight_store_fetch_seconds",
                                     "A FetchTensors stream, or building a UCX read plan.")),
      grpc_in_(BytesCounter(kInName, kInHelp, "grpc")),
      ucx_in_(BytesCounter(kInName, kInHelp, "ucx")),
      grpc_out_(BytesCounter(kOutName, kOutHelp, "grpc")),
      ucx_out_(BytesCounter(kOutName, kOutHelp, "ucx")),
      versions_(Gauge("tandem_weight_store_versions", "Committed versions held.")),
      held_bytes_(Gauge("tandem_weight_store_held_bytes", "Bytes of the committed versions held.")),
      leases_(Gauge("tandem_weight_store_active_leases", "Leases not yet released or expired.")),
      open_uploads_(Gauge("tandem_weight_store_open_uploads", "Uploads begun, not yet ended.")) {}

void WeightStoreMetrics::RecordIn(Transport transport, int64_t bytes) {
  (transport == Transport::kUcx ? ucx_in_ : grpc_in_).Increment(static_cast<double>(bytes));
}

void WeightStoreMetrics::RecordOut(Transport transport, int64_t bytes) {
  (transport == Transport::kUcx ? ucx_out_ : grpc_out_).Increment(static_cast<double>(bytes));
}

void WeightStoreMetrics::RecordTotals(const AdapterStore::Totals& totals) {
  versions_.Set(static_cast<double>(totals.versions));
  held_bytes_.Set(static_cast<double>(totals.bytes));
  leases_.Set(static_cast<double>(totals.leases));
  open_uploads_.Set(static_cast<double>(totals.open_uploads));
}

}  // namespace tandem::weight_store
