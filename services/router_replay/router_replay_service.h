#ifndef TANDEM_SERVICES_ROUTER_REPLAY_ROUTER_REPLAY_SERVICE_H_
#define TANDEM_SERVICES_ROUTER_REPLAY_ROUTER_REPLAY_SERVICE_H_

#include "common/unimplemented.h"
#include "tandem/v1/router_replay.grpc.pb.h"

namespace tandem::router_replay {

// gRPC adapter of the router-replay service. Per-token routing records, replay fetch, expert load
// and placement (issue #4). Until then every RPC answers UNIMPLEMENTED naming itself.
class RouterReplayServiceImpl final : public v1::RouterReplayService::CallbackService {
 public:
  grpc::ServerReadReactor<v1::AppendRequest>* Append(grpc::CallbackServerContext* /*context*/,
                                                     v1::AppendResponse* /*response*/) override {
    return FinishStreamUnimplemented<grpc::ServerReadReactor<v1::AppendRequest>>(
        "tandem.v1.RouterReplayService/Append");
  }

  grpc::ServerUnaryReactor* Seal(grpc::CallbackServerContext* context,
                                 const v1::SealRequest* /*request*/,
                                 v1::SealResponse* /*response*/) override {
    return FinishUnimplemented(context, "tandem.v1.RouterReplayService/Seal");
  }

  grpc::ServerWriteReactor<v1::FetchRoutesResponse>* FetchRoutes(
      grpc::CallbackServerContext* /*context*/,
      const v1::FetchRoutesRequest* /*request*/) override {
    return FinishStreamUnimplemented<grpc::ServerWriteReactor<v1::FetchRoutesResponse>>(
        "tandem.v1.RouterReplayService/FetchRoutes");
  }

  grpc::ServerUnaryReactor* GetExpertLoad(grpc::CallbackServerContext* context,
                                          const v1::GetExpertLoadRequest* /*request*/,
                                          v1::GetExpertLoadResponse* /*response*/) override {
    return FinishUnimplemented(context, "tandem.v1.RouterReplayService/GetExpertLoad");
  }

  grpc::ServerUnaryReactor* PlanPlacement(grpc::CallbackServerContext* context,
                                          const v1::PlanPlacementRequest* /*request*/,
                                          v1::PlanPlacementResponse* /*response*/) override {
    return FinishUnimplemented(context, "tandem.v1.RouterReplayService/PlanPlacement");
  }

  grpc::ServerUnaryReactor* DeleteRecords(grpc::CallbackServerContext* context,
                                          const v1::DeleteRecordsRequest* /*request*/,
                                          v1::DeleteRecordsResponse* /*response*/) override {
    return FinishUnimplemented(context, "tandem.v1.RouterReplayService/DeleteRecords");
  }
};

}  // namespace tandem::router_replay

#endif  // TANDEM_SERVICES_ROUTER_REPLAY_ROUTER_REPLAY_SERVICE_H_
