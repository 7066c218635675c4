#ifndef TANDEM_COMMON_SERVER_H_
#define TANDEM_COMMON_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "common/server_options.h"
#include "grpcpp/impl/service_type.h"
#include "grpcpp/server.h"

namespace tandem {

// A gRPC service and the full proto name health checks report it under.
struct HostedService {
  std::string proto_name;  // e.g. "tandem.v1.JobService".
  std::unique_ptr<grpc::Service> service;
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
  int metrics_port() const { return metrics_->port(); }

  // Reports SERVING for every hosted service; call once the service can do its work.
  void SetReady();

  // Graceful drain: NOT_SERVING, wait --drain_delay, refuse new calls, give in-flight calls
  // up to --drain_timeout, then cancel what is left. Blocks until the server has stopped;
  // later calls return at once.
  void Drain();

 private:
  ServiceServer(std::string name, std::vector<HostedService> services, ServerOptions options);
  void SetServing(bool serving);

  const std::string name_;
  std::vector<HostedService> services_;
  const ServerOptions options_;
  std::unique_ptr<MetricsEndpoint> metrics_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Mutex drain_mutex_;
  bool drained_ ABSL_GUARDED_BY(drain_mutex_) = false;
};

// Blocks SIGTERM and SIGINT in the calling thread and every thread it creates later, so that
// WaitForTerminationSignal receives them. Call first thing in main, before gRPC starts threads.
void BlockTerminationSignals();

// Waits until SIGTERM or SIGINT arrives; returns its number.
int WaitForTerminationSignal();

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVER_H_
