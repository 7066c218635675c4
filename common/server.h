#ifndef TANDEM_COMMON_SERVER_H_
#define TANDEM_COMMON_SERVER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/call_tracker.h"
#include "common/metrics.h"
#include "common/periodic_thread.h"
#include "common/server_options.h"
#include "grpcpp/impl/service_type.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"

namespace tandem {

// The health-check name that is SERVING as long as the server answers at all (Kubernetes
// liveness probes ask it); "" and each service's name report readiness.
inline constexpr absl::string_view kLivenessService = "liveness";

// A gRPC service and the full proto name health checks report it under.
struct HostedService {
  std::string proto_name;  // e.g. "tandem.trainer.v1.JobService".
  std::unique_ptr<grpc::Service> service;
  // Optional: whether the service can do its work yet (e.g. rollout until its weights are
  // loaded). Null: ready as soon as the server is.
  std::function<bool()> ready;
  // Optional: called when a drain begins (after --drain_delay, before new calls are refused),
  // so long-running calls can end early with what they have.
  std::function<void()> drain;
};

// The server every Tandem service runs in: standard health service (NOT_SERVING until
// SetReady and again while draining), reflection, keepalive, message limits, bearer-token
// auth, optional TLS/mTLS, RPC metrics and a Prometheus /metrics endpoint.
class ServiceServer {
 public:
  // `name` labels logs and metrics ("trainer", "rollout", ...). Fails with UNAVAILABLE when
  // a port cannot be bound.
  static absl::StatusOr<std::unique_ptr<ServiceServer>> Start(std::string name,
                                                              std::vector<HostedService> services,
                                                              const ServerOptions& options);
  ~ServiceServer();

  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }

  // Reports SERVING once every hosted service's `ready` probe passes (polled on a background
  // thread when some do not pass yet); call once the server can do its work.
  void SetReady();

  // Graceful drain: NOT_SERVING, wait --drain_delay, tell the services (HostedService::drain),
  // refuse new calls, give in-flight calls up to --drain_timeout, then cancel what is left. Blocks until the server has stopped;
  // later calls return at once.
  void Drain();

 private:
  ServiceServer(std::string name, std::vector<HostedService> services, ServerOptions options);
  void SetServing(bool serving);
  bool AllServicesReady() const;
  // Polled by readiness_poller_; flips to SERVING once every probe passes.
  void PollReadiness();

  const std::string name_;
  std::vector<HostedService> services_;
  const ServerOptions options_;
  int metrics_port_ = 0;
  CallTracker in_flight_;  // Calls in progress (InFlightCallsInterceptorFactory); outlives server_.
  // What the listener's credentials call back into (certificate and token files); outlives
  // server_.
  std::shared_ptr<grpc::ServerCredentials> credentials_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Mutex drain_mutex_;
  bool drained_ ABSL_GUARDED_BY(drain_mutex_) = false;
  bool serving_ ABSL_GUARDED_BY(drain_mutex_) = false;
  std::unique_ptr<PeriodicThread> readiness_poller_;
};

// Blocks SIGTERM and SIGINT in the calling thread and every thread it creates later, so that
// WaitForTerminationSignal receives them. Call first thing in main, before gRPC starts threads.
void BlockTerminationSignals();

// Waits until SIGTERM or SIGINT arrives; returns its number.
int WaitForTerminationSignal();

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVER_H_
