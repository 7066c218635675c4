#include "common/server.h"

#include <signal.h>

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/auth.h"
#include "common/in_flight_calls.h"
#include "common/logging.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server_builder.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"

namespace tandem {
namespace {

// How often readiness probes are asked while a service is not ready yet: cheap calls, and a
// replica that became ready should not wait long to take traffic.
constexpr absl::Duration kReadinessPollInterval = absl::Milliseconds(50);
// How often a drain checks whether calls are still in progress.
constexpr absl::Duration kDrainPollInterval = absl::Milliseconds(10);

int Milliseconds(absl::Duration duration) {
  return static_cast<int>(absl::ToInt64Milliseconds(duration));
}

std::function<void()> CountAuthRejections(const std::string& service) {
  prometheus::Counter& rejected = prometheus::BuildCounter()
                                      .Name("tandem_auth_rejected_total")
                                      .Help("Calls refused for a missing or wrong bearer token.")
                                      .Register(MetricsRegistry())
                                      .Add({{"service", service}});
  return [&rejected] { rejected.Increment(); };
}

// tandem_tls_certificate_expiry_timestamp_seconds{service}: when the certificate this server
// serves now expires, for an alert well before it does.
std::function<void(absl::Time)> RecordCertificateExpiry(const std::string& service) {
  prometheus::Gauge& expiry =
      prometheus::BuildGauge()
          .Name("tandem_tls_certificate_expiry_timestamp_seconds")
          .Help("Expiry (notAfter, Unix seconds) of the TLS certificate this server serves.")
          .Register(MetricsRegistry())
          .Add({{"service", service}});
  return [&expiry](absl::Time not_after) { expiry.Set(absl::ToUnixSeconds(not_after)); };
}

void ApplyChannelOptions(const ServerOptions& options, grpc::ServerBuilder& builder) {
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, Milliseconds(options.keepalive_time));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                             Milliseconds(options.keepalive_timeout));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // gRPC lets several processes share a port by default; a second trainer started on a
  // busy port must fail instead of silently taking half the traffic.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // The reflection service is synchronous; its pollers notice shutdown only when their
  // wait times out, so keep that wait short or every drain takes seconds.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::CQ_TIMEOUT_MSEC, 100);
  // Clients ping idle watch streams as often as every keepalive_time; allow that without
  // the "too_many_pings" GOAWAY.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             Milliseconds(options.keepalive_time / 2));
}

}  // namespace

ServiceServer::ServiceServer(std::string name, std::vector<HostedService> services,
                             ServerOptions options)
    : name_(std::move(name)), services_(std::move(services)), options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<ServiceServer>> ServiceServer::Start(
    std::string name, std::vector<HostedService> services, const ServerOptions& options) {
  std::unique_ptr<ServiceServer> server(
      new ServiceServer(std::move(name), std::move(services), options));
  auto metrics_port = ServeMetrics(options.host, options.metrics_port);
  if (!metrics_port.ok()) return metrics_port.status();
  server->metrics_port_ = *metrics_port;
  RecordBuildInfo(server->name_);
  RecordLoading(server->name_, true);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  const std::string address = absl::StrCat(options.host, ":", options.port);
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = MakeServerCredentials(
      options, {.on_rejected = CountAuthRejections(server->name_),
                .on_certificate_served = RecordCertificateExpiry(server->name_)});
  if (!credentials.ok()) return credentials.status();
  server->credentials_ = *std::move(credentials);
  builder.AddListeningPort(address, server->credentials_, &server->port_);
  ApplyChannelOptions(options, builder);
  for (HostedService& hosted : server->services_) builder.RegisterService(hosted.service.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<RpcMetricsInterceptorFactory>());
  interceptors.push_back(std::make_unique<InFlightCallsInterceptorFactory>(server->in_flight_));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));

  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve gRPC on ", address, " (port in use, or TLS material invalid?)"));
  }
  server->SetServing(false);
  // Liveness asks only whether the process still answers: it must not fail while the server
  // loads its model or drains, which readiness ("") reports.
  server->server_->GetHealthCheckService()->SetServingStatus(std::string(kLivenessService), true);
  spdlog::info(
      "{} listening on {}:{}, metrics on :{}/metrics, auth {}, {}", server->name_, options.host,
      server->port_, server->metrics_port(),
      options.auth_token.empty() && options.auth_token_file.empty() ? "OFF" : "on",
      options.tls.has_value() ? (options.tls->client_ca.empty() ? "TLS" : "mTLS") : "plaintext");
  return server;
}

ServiceServer::~ServiceServer() { Drain(); }

void ServiceServer::SetServing(bool serving) {
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  // Not the overload without a name: it would set every name, liveness too.
  health->SetServingStatus("", serving);
  for (const HostedService& hosted : services_) {
    health->SetServingStatus(hosted.proto_name, serving);
  }
}

bool ServiceServer::AllServicesReady() const {
  for (const HostedService& hosted : services_) {
    if (hosted.ready && !hosted.ready()) return false;
  }
  return true;
}

void ServiceServer::PollReadiness() {
  if (!AllServicesReady()) return;
  absl::MutexLock lock(&drain_mutex_);
  if (drained_ || serving_) return;
  serving_ = true;
  RecordLoading(name_, false);  // Before SERVING: whoever sees SERVING sees loading over.
  SetServing(true);
  spdlog::info("{} is ready", name_);
}

void ServiceServer::SetReady() {
  PollReadiness();
  absl::MutexLock lock(&drain_mutex_);
  if (serving_ || drained_) return;
  spdlog::info("{} is up; NOT_SERVING until its services are ready", name_);
  readiness_poller_ =
      std::make_unique<PeriodicThread>(kReadinessPollInterval, [this] { PollReadiness(); });
}

void ServiceServer::Drain() {
  readiness_poller_.reset();  // Before taking the mutex: a poll in progress takes it too.
  absl::MutexLock lock(&drain_mutex_);
  if (drained_ || server_ == nullptr) return;
  drained_ = true;
  spdlog::info("{} draining: NOT_SERVING, in-flight calls get up to {}", name_,
               absl::FormatDuration(options_.drain_timeout));
  SetServing(false);
  absl::SleepFor(options_.drain_delay);
  const absl::Time deadline = absl::Now() + options_.drain_timeout;
  for (const HostedService& hosted : services_) {
    if (hosted.drain) hosted.drain();
  }
  // Shutdown refuses new calls at once, then waits for the calls in progress (until the
  // deadline) and for every connection to close -- which an idle client does only once it
  // answers the GOAWAY's ping: seconds for a client that polls lazily, 20 s for one that never
  // does. Once no call is in progress, closing the connections loses nothing.
  absl::Notification shut_down;
  std::thread shutdown([&] {
    server_->Shutdown(absl::ToChronoTime(deadline));
    shut_down.Notify();
  });
  while (!shut_down.WaitForNotificationWithTimeout(kDrainPollInterval)) {
    if (in_flight_.WaitUntilIdle(absl::ZeroDuration())) {
      grpc_server_cancel_all_calls(server_->c_server());
    }
  }
  shutdown.join();
  server_->Wait();
  spdlog::info("{} stopped", name_);
}

void BlockTerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

int WaitForTerminationSignal() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  int received = 0;
  sigwait(&signals, &received);
  return received;
}

}  // namespace tandem
