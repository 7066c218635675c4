#ifndef TANDEM_SERVICES_WEIGHT_STORE_CLIENT_TESTING_WEIGHT_STORE_SERVER_H_
#define TANDEM_SERVICES_WEIGHT_STORE_CLIENT_TESTING_WEIGHT_STORE_SERVER_H_

// The real weight-store (the binary's core and gRPC front end) for other services' in-process
// tests and benchmarks, which host it on loopback: no fake where the real store can run. The
// only way outside services/weight_store reaches the server's code, and only from testonly
// targets.
#include <memory>

#include "common/testing/test_server.h"
#include "services/weight_store/weight_store_service.h"
#include "services/weight_store/weight_store_ucx_service.h"

namespace tandem::weight_store::testing {

// The weight-store's services (public API and UCX data plane) on loopback.
inline absl::StatusOr<tandem::testing::LoopbackServer> StartWeightStore(
    const WeightStoreOptions& options,
    const ServerOptions& server_options = tandem::testing::LoopbackOptions()) {
  absl::StatusOr<std::vector<HostedService>> services = WeightStoreServices(options);
  if (!services.ok()) return services.status();
  return tandem::testing::StartLoopbackServer("weight-store", *std::move(services),
                                              server_options);
}

// The data plane as stores served it before WatchReadPlans: every other call is the real one's,
// WatchReadPlans UNIMPLEMENTED (the generated service's answer), for clients' fallback tests.
class DataPlaneWithoutPushedPlans final
    : public internal::v1::WeightStoreUcxService::CallbackService {
 public:
  explicit DataPlaneWithoutPushedPlans(std::unique_ptr<WeightStoreUcxServiceImpl> real)
      : real_(std::move(real)) {}

  grpc::ServerUnaryReactor* BeginUcxPublish(
      grpc::CallbackServerContext* context, const internal::v1::BeginUcxPublishRequest* request,
      internal::v1::BeginUcxPublishResponse* response) override {
    return real_->BeginUcxPublish(context, request, response);
  }
  grpc::ServerUnaryReactor* GetReadPlan(grpc::CallbackServerContext* context,
                                        const internal::v1::GetReadPlanRequest* request,
                                        internal::v1::GetReadPlanResponse* response) override {
    return real_->GetReadPlan(context, request, response);
  }
  grpc::ServerUnaryReactor* ExchangeUcxEndpoint(
      grpc::CallbackServerContext* context, const internal::v1::ExchangeUcxEndpointRequest* request,
      internal::v1::ExchangeUcxEndpointResponse* response) override {
    return real_->ExchangeUcxEndpoint(context, request, response);
  }

 private:
  std::unique_ptr<WeightStoreUcxServiceImpl> real_;
};

// StartWeightStore, as a store older than WatchReadPlans.
inline absl::StatusOr<tandem::testing::LoopbackServer> StartWeightStoreWithoutPushedPlans(
    const WeightStoreOptions& options,
    const ServerOptions& server_options = tandem::testing::LoopbackOptions()) {
  absl::StatusOr<std::unique_ptr<WeightStoreServiceImpl>> service =
      WeightStoreServiceImpl::Create(options);
  if (!service.ok()) return service.status();
  WeightStoreServiceImpl* api = service->get();
  auto data_plane = std::make_unique<DataPlaneWithoutPushedPlans>(api->NewUcxService());
  std::vector<HostedService> services;
  services.push_back({"tandem.weightstore.v1.WeightStoreService", *std::move(service),
                      /*ready=*/nullptr, [api] { api->Drain(); }});
  services.push_back({"tandem.internal.v1.WeightStoreUcxService", std::move(data_plane)});
  return tandem::testing::StartLoopbackServer("weight-store", std::move(services), server_options);
}

}  // namespace tandem::weight_store::testing

#endif  // TANDEM_SERVICES_WEIGHT_STORE_CLIENT_TESTING_WEIGHT_STORE_SERVER_H_
