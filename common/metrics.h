#ifndef TANDEM_COMMON_METRICS_H_
#define TANDEM_COMMON_METRICS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/server_interceptor.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace tandem {

// The one registry of this process; every Tandem metric registers here.
prometheus::Registry& MetricsRegistry();

// Serves the process registry as Prometheus text at http://host:port/metrics and returns the
// bound port (port 0 lets the OS pick). One endpoint per process, never stopped: stopping
// prometheus-cpp's exposer takes about two seconds, which every server shutdown (and every
// in-process test server) would pay. The first call binds; a later call for the same host with
// port 0 or the bound port shares it, any other is FAILED_PRECONDITION. UNAVAILABLE when the
// port cannot be bound.
absl::StatusOr<int> ServeMetrics(const std::string& host, int port);

// Sets tandem_build_info{service,version} to 1, the usual way to expose what runs where.
void RecordBuildInfo(absl::string_view service);

// tandem_service_loading{service}: 1 from the start of the process until the service is first
// ready (rollout loading its model, the stores opening their data), then 0 -- so that an alert
// can tell a slow cold start from a service that is gone.
void RecordLoading(absl::string_view service, bool loading);

// Records every call a server handles:
//   tandem_rpc_server_started_total{service,method}
//   tandem_rpc_server_handled_total{service,method,code}
//   tandem_rpc_server_handling_seconds{service,method,code} (histogram)
// Labels come from the registered method path, so their set is bounded.
class RpcMetricsInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  RpcMetricsInterceptorFactory();
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

  struct Families {
    prometheus::Family<prometheus::Counter>& started;
    prometheus::Family<prometheus::Counter>& handled;
    prometheus::Family<prometheus::Histogram>& handling_seconds;
  };

 private:
  Families families_;
};

// Upper bounds of the latency histograms, from 100 µs to 5 min: control RPCs take
// milliseconds, long streams (watch, fetch of a large adapter) minutes.
const prometheus::Histogram::BucketBoundaries& LatencyBuckets();

// A label-less latency histogram (LatencyBuckets) in the process registry.
prometheus::Histogram& LatencyHistogram(const std::string& name, const std::string& help);

}  // namespace tandem

#endif  // TANDEM_COMMON_METRICS_H_
