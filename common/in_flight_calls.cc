#include "common/in_flight_calls.h"

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace tandem {
namespace {

// Holds a token for as long as its call lives: gRPC destroys a call's interceptors with it.
class InFlightCallInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit InFlightCallInterceptor(CallTracker& calls) : token_(calls) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    methods->Proceed();
  }

 private:
  CallTracker::Token token_;
};

bool EndsOnlyWithTheServer(absl::string_view method) {
  return method == "/grpc.health.v1.Health/Watch" || absl::StartsWith(method, "/grpc.reflection.");
}

}  // namespace

grpc::experimental::Interceptor* InFlightCallsInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  if (EndsOnlyWithTheServer(info->method())) return nullptr;  // gRPC skips a null interceptor.
  return new InFlightCallInterceptor(calls_);
}

}  // namespace tandem
