#include "common/metrics.h"

#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <exception>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/version.h"
#include "grpcpp/support/status.h"
#include "prometheus/exposer.h"
#include "prometheus/gauge.h"

// The /metrics server's threads are civetweb's, which Debian builds with a fixed 100 KiB stack
// (USE_STACK_SIZE=102400). prometheus-cpp's handler plus civetweb's 8 KiB printf buffer reach
// about 95 KiB of it, and the static TLS of every loaded library is carved from the same
// allocation: linking the CUDA runtime (a 4 KiB-aligned TLS block) was enough to crash scrapes.
// So every thread that asks for a stack size gets at least kThreadStackFloor; the call then goes
// on to the C library. Interposing is the only way in: the size is compiled into civetweb.
extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t stack_size) {
  constexpr size_t kThreadStackFloor = size_t{1} << 20;
  using Setter = int (*)(pthread_attr_t*, size_t);
  static const Setter c_library_setter =
      reinterpret_cast<Setter>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  return c_library_setter(attr, std::max(stack_size, kThreadStackFloor));
}

namespace tandem {
namespace {

using grpc::experimental::InterceptionHookPoints;

// "/tandem.trainer.v1.JobService/GetJob" -> {"tandem.trainer.v1.JobService", "GetJob"}.
std::pair<std::string, std::string> SplitMethodPath(absl::string_view path) {
  if (!path.empty() && path.front() == '/') path.remove_prefix(1);
  const size_t slash = path.find('/');
  if (slash == absl::string_view::npos) return {std::string(path), ""};
  return {std::string(path.substr(0, slash)), std::string(path.substr(slash + 1))};
}

std::string CodeName(grpc::StatusCode code) {
  static constexpr const char* kNames[] = {"OK",
                                           "CANCELLED",
                                           "UNKNOWN",
                                           "INVALID_ARGUMENT",
                                           "DEADLINE_EXCEEDED",
                                           "NOT_FOUND",
                                           "ALREADY_EXISTS",
                                           "PERMISSION_DENIED",
                                           "RESOURCE_EXHAUSTED",
                                           "FAILED_PRECONDITION",
                                           "ABORTED",
                                           "OUT_OF_RANGE",
                                           "UNIMPLEMENTED",
                                           "INTERNAL",
                                           "UNAVAILABLE",
                                           "DATA_LOSS",
                                           "UNAUTHENTICATED"};
  const int index = static_cast<int>(code);
  return index >= 0 && index < 17 ? kNames[index] : absl::StrCat("CODE_", index);
}

class RpcMetricsInterceptor : public grpc::experimental::Interceptor {
 public:
  RpcMetricsInterceptor(const RpcMetricsInterceptorFactory::Families& families,
                        absl::string_view method_path)
      : families_(families), start_(std::chrono::steady_clock::now()) {
    std::tie(service_, method_) = SplitMethodPath(method_path);
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      families_.started.Add({{"service", service_}, {"method", method_}}).Increment();
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      Record(methods->GetSendStatus().error_code());
    }
    methods->Proceed();
  }

 private:
  void Record(grpc::StatusCode code) {
    const prometheus::Labels labels = {
        {"service", service_}, {"method", method_}, {"code", CodeName(code)}};
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start_;
    families_.handled.Add(labels).Increment();
    families_.handling_seconds.Add(labels, LatencyBuckets()).Observe(elapsed.count());
  }

  const RpcMetricsInterceptorFactory::Families& families_;
  const std::chrono::steady_clock::time_point start_;
  std::string service_;
  std::string method_;
};

}  // namespace

namespace {

// Never destroyed: exporters may read it while the process exits.
const std::shared_ptr<prometheus::Registry>& SharedRegistry() {
  static const auto* registry =
      new std::shared_ptr<prometheus::Registry>(std::make_shared<prometheus::Registry>());
  return *registry;
}

}  // namespace

prometheus::Registry& MetricsRegistry() { return *SharedRegistry(); }

absl::StatusOr<int> ServeMetrics(const std::string& host, int port) {
  struct Endpoint {
    std::string host;
    int port;
    prometheus::Exposer* exposer;  // Kept reachable: never destroyed is not leaked.
  };
  static absl::Mutex mutex(absl::kConstInit);
  static const Endpoint* endpoint ABSL_GUARDED_BY(mutex) = nullptr;  // Never destroyed.
  absl::MutexLock lock(&mutex);
  if (endpoint != nullptr) {
    if (endpoint->host == host && (port == 0 || port == endpoint->port)) return endpoint->port;
    return absl::FailedPreconditionError(
        absl::StrCat("this process already serves /metrics on ", endpoint->host, ":",
                     endpoint->port, "; cannot also serve it on ", host, ":", port));
  }
  const std::string address = absl::StrCat(host, ":", port);
  prometheus::Exposer* exposer = nullptr;
  try {
    exposer = new prometheus::Exposer(address);  // Never destroyed, see above.
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve /metrics on ", address, ": ", e.what()));
  }
  exposer->RegisterCollectable(SharedRegistry());  // Held weakly by the exposer.
  endpoint = new Endpoint{host, exposer->GetListeningPorts().at(0), exposer};
  return endpoint->port;
}

void RecordBuildInfo(absl::string_view service) {
  prometheus::BuildGauge()
      .Name("tandem_build_info")
      .Help("Always 1; labels say which Tandem service and version this process runs.")
      .Register(MetricsRegistry())
      .Add({{"service", std::string(service)}, {"version", std::string(kTandemVersion)}})
      .Set(1);
}

void RecordLoading(absl::string_view service, bool loading) {
  static auto& family =
      prometheus::BuildGauge()
          .Name("tandem_service_loading")
          .Help("1 until the service is first ready (loading its model or data), then 0.")
          .Register(MetricsRegistry());
  family.Add({{"service", std::string(service)}}).Set(loading ? 1 : 0);
}

const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
      0.25,   0.5,     1,      2.5,   5,      10,    30,   60,    120,  300};
  return *buckets;
}

RpcMetricsInterceptorFactory::RpcMetricsInterceptorFactory()
    : families_{prometheus::BuildCounter()
                    .Name("tandem_rpc_server_started_total")
                    .Help("RPCs the server started handling.")
                    .Register(MetricsRegistry()),
                prometheus::BuildCounter()
                    .Name("tandem_rpc_server_handled_total")
                    .Help("RPCs the server finished, by status code.")
                    .Register(MetricsRegistry()),
                prometheus::BuildHistogram()
                    .Name("tandem_rpc_server_handling_seconds")
                    .Help("Time from receiving a call to sending its status, in seconds.")
                    .Register(MetricsRegistry())} {}

grpc::experimental::Interceptor* RpcMetricsInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  return new RpcMetricsInterceptor(families_, info->method());
}

prometheus::Histogram& LatencyHistogram(const std::string& name, const std::string& help) {
  return prometheus::BuildHistogram()
      .Name(name)
      .Help(help)
      .Register(MetricsRegistry())
      .Add({}, LatencyBuckets());
}

}  // namespace tandem
