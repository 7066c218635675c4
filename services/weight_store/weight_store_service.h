#ifndef TANDEM_SERVICES_WEIGHT_STORE_WEIGHT_STORE_SERVICE_H_
#define TANDEM_SERVICES_WEIGHT_STORE_WEIGHT_STORE_SERVICE_H_

#include "common/unimplemented.h"
#include "tandem/v1/weight_store.grpc.pb.h"

namespace tandem::weight_store {

// gRPC adapter of the weight-store service. Versioned LoRA adapters moved by UCX, resharded per
// consumer (issue #5). Until then every RPC answers UNIMPLEMENTED naming itself.
class WeightStoreServiceImpl final : public v1::WeightStoreService::CallbackService {
 public:
  grpc::ServerUnaryReactor* BeginPublish(grpc::CallbackServerContext* context,
                                         const v1::BeginPublishRequest* /*request*/,
                                         v1::BeginPublishResponse* /*response*/) override {
    return FinishUnimplemented(context, "tandem.v1.WeightStoreService/BeginPublish");
  }

  grpc::ServerReadReactor<v1::PutShardRequest>* PutShard(
      grpc::CallbackServerContext* /*context*/, v1::PutShardResponse* /*response*/) override {
    return FinishStreamUnimplemented<grpc::ServerReadReactor<v1::PutShardRequest>>(
        "tandem.v1.WeightStoreService/PutShard");
  }

  grpc::ServerUnaryReactor* CommitPublish(grpc::CallbackServerContext* context,
                                          const v1::CommitPublishRequest* /*request*/,
                                          v1::CommitPublishResponse* /*response*/) override {
    return FinishUnimplemented(context, "tandem.v1.WeightStoreService/CommitPublish");
  }

  grpc::ServerUnaryReactor* AbortPublish(grpc::CallbackServerContext* context,
                                         const v1::AbortPublishRequest* /*request*/,
                                         v1::AbortPublishResponse* /*response*/) override {
    return FinishUnimplemented(context, "tandem.v1.WeightStoreService/AbortPublish");
  }

  grpc::ServerUnaryReactor* GetManifest(grpc::CallbackServerContext* context,
                                        const v1::GetManifestRequest* /*request*/,
                                        v1::GetManifestResponse* /*response*/) override {
    return FinishUnimplemented(context, "tandem.v1.WeightStoreService/GetManifest");
  }

  grpc::ServerWriteReactor<v1::WatchVersionsResponse>* WatchVersions(
      grpc::CallbackServerContext* /*context*/,
      const v1::WatchVersionsRequest* /*request*/) override {
    return FinishStreamUnimplemented<grpc::ServerWriteReactor<v1::WatchVersionsResponse>>(
        "tandem.v1.WeightStoreService/WatchVersions");
  }

  grpc::ServerWriteReactor<v1::FetchTensorsResponse>* FetchTensors(
      grpc::CallbackServerContext* /*context*/,
      const v1::FetchTensorsRequest* /*request*/) override {
    return FinishStreamUnimplemented<grpc::ServerWriteReactor<v1::FetchTensorsResponse>>(
        "tandem.v1.WeightStoreService/FetchTensors");
  }

  grpc::ServerUnaryReactor* GetReadPlan(grpc::CallbackServerContext* context,
                                        const v1::GetReadPlanRequest* /*request*/,
                                        v1::GetReadPlanResponse* /*response*/) override {
    return FinishUnimplemented(context, "tandem.v1.WeightStoreService/GetReadPlan");
  }

  grpc::ServerUnaryReactor* ExchangeUcxEndpoint(
      grpc::CallbackServerContext* context, const v1::ExchangeUcxEndpointRequest* /*request*/,
      v1::ExchangeUcxEndpointResponse* /*response*/) override {
    return FinishUnimplemented(context, "tandem.v1.WeightStoreService/ExchangeUcxEndpoint");
  }

  grpc::ServerUnaryReactor* AcquireLease(grpc::CallbackServerContext* context,
                                         const v1::AcquireLeaseRequest* /*request*/,
                                         v1::AcquireLeaseResponse* /*response*/) override {
    return FinishUnimplemented(context, "tandem.v1.WeightStoreService/AcquireLease");
  }

  grpc::ServerUnaryReactor* RenewLease(grpc::CallbackServerContext* context,
                                       const v1::RenewLeaseRequest* /*request*/,
                                       v1::RenewLeaseResponse* /*response*/) override {
    return FinishUnimplemented(context, "tandem.v1.WeightStoreService/RenewLease");
  }

  grpc::ServerUnaryReactor* ReleaseLease(grpc::CallbackServerContext* context,
                                         const v1::ReleaseLeaseRequest* /*request*/,
                                         v1::ReleaseLeaseResponse* /*response*/) override {
    return FinishUnimplemented(context, "tandem.v1.WeightStoreService/ReleaseLease");
  }
};

}  // namespace tandem::weight_store

#endif  // TANDEM_SERVICES_WEIGHT_STORE_WEIGHT_STORE_SERVICE_H_
