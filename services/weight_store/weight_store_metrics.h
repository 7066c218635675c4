#ifndef TANDEM_SERVICES_WEIGHT_STORE_WEIGHT_STORE_METRICS_H_
#define TANDEM_SERVICES_WEIGHT_STORE_WEIGHT_STORE_METRICS_H_

#include <cstdint>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "services/weight_store/adapter_store.h"

namespace tandem::weight_store {

enum class Transport { kGrpc, kUcx };

// The weight-store's Prometheus series (process-wide, in MetricsRegistry()).
class WeightStoreMetrics {
 public:
  static WeightStoreMetrics& Get();

  // Bytes into the store (publish) and out of it (fetch). UCX moves bytes one-sided, so for
  // it these count what commits and read plans cover.
  void RecordIn(Transport transport, int64_t bytes);
  void RecordOut(Transport transport, int64_t bytes);
  void RecordTotals(const AdapterStore::Totals& totals);

  prometheus::Histogram& publish_seconds;  // BeginPublish to successful commit.
  prometheus::Histogram& fetch_seconds;    // A FetchTensors stream, or building a read plan.

 private:
  WeightStoreMetrics();

  prometheus::Counter& grpc_in_;
  prometheus::Counter& ucx_in_;
  prometheus::Counter& grpc_out_;
  prometheus::Counter& ucx_out_;
  prometheus::Gauge& versions_;
  prometheus::Gauge& held_bytes_;
  prometheus::Gauge& leases_;
  prometheus::Gauge& open_uploads_;
};

}  // namespace tandem::weight_store

#endif  // TANDEM_SERVICES_WEIGHT_STORE_WEIGHT_STORE_METRICS_H_
