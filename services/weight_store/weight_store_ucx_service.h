#ifndef TANDEM_SERVICES_WEIGHT_STORE_WEIGHT_STORE_UCX_SERVICE_H_
#define TANDEM_SERVICES_WEIGHT_STORE_WEIGHT_STORE_UCX_SERVICE_H_

#include <memory>

#include "common/open_streams.h"
#include "services/weight_store/adapter_store.h"
#include "services/weight_store/read_planner.h"
#include "tandem/internal/v1/weight_store_ucx.grpc.pb.h"
#include "transfer/ucx_transport.h"

namespace tandem::weight_store {

// gRPC front end of the weight-store's UCX data plane (tandem.internal.v1), served beside the
// public WeightStoreService over the same store: uploads into registered memory, read plans
// (ReadPlanner) and the worker-address exchange. Without UCX (`ucx` null) every call is
// FAILED_PRECONDITION, so a client falls back to the public gRPC data path.
class WeightStoreUcxServiceImpl final : public internal::v1::WeightStoreUcxService::CallbackService {
 public:
  WeightStoreUcxServiceImpl(std::shared_ptr<transfer::UcxWorker> ucx,
                            std::shared_ptr<AdapterStore> store);

  grpc::ServerUnaryReactor* BeginUcxPublish(
      grpc::CallbackServerContext* context, const internal::v1::BeginUcxPublishRequest* request,
      internal::v1::BeginUcxPublishResponse* response) override;
  grpc::ServerUnaryReactor* GetReadPlan(grpc::CallbackServerContext* context,
                                        const internal::v1::GetReadPlanRequest* request,
                                        internal::v1::GetReadPlanResponse* response) override;
  grpc::ServerUnaryReactor* ExchangeUcxEndpoint(
      grpc::CallbackServerContext* context,
      const internal::v1::ExchangeUcxEndpointRequest* request,
      internal::v1::ExchangeUcxEndpointResponse* response) override;
  grpc::ServerWriteReactor<internal::v1::WatchReadPlansResponse>* WatchReadPlans(
      grpc::CallbackServerContext* context,
      const internal::v1::WatchReadPlansRequest* request) override;

  // For a server drain: ends every WatchReadPlans stream with UNAVAILABLE (watch again).
  void Drain();

 private:
  absl::Status CheckUcx() const;

  // Declared first: the worker outlives the store's registered memory.
  std::shared_ptr<transfer::UcxWorker> ucx_;
  std::shared_ptr<AdapterStore> store_;
  std::unique_ptr<ReadPlanner> planner_;  // Null without UCX.
  OpenStreams<internal::v1::WatchReadPlansResponse> watches_;
};

}  // namespace tandem::weight_store

#endif  // TANDEM_SERVICES_WEIGHT_STORE_WEIGHT_STORE_UCX_SERVICE_H_
