#ifndef TANDEM_SERVICES_ROLLOUT_ROLLOUT_SERVICE_H_
#define TANDEM_SERVICES_ROLLOUT_ROLLOUT_SERVICE_H_

#include "common/unimplemented.h"
#include "tandem/v1/rollout.grpc.pb.h"

namespace tandem::rollout {

// gRPC adapter of the rollout service. Generation with routing capture and adapter hot-swap (issue
// #6). Until then every RPC answers UNIMPLEMENTED naming itself.
class RolloutServiceImpl final : public v1::RolloutService::CallbackService {
 public:
  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* /*context*/, const v1::GenerateRequest* /*request*/) override {
    return FinishStreamUnimplemented<grpc::ServerWriteReactor<v1::GenerateResponse>>(
        "tandem.v1.RolloutService/Generate");
  }

  grpc::ServerUnaryReactor* GetAdapterStatus(grpc::CallbackServerContext* context,
                                             const v1::GetAdapterStatusRequest* /*request*/,
                                             v1::GetAdapterStatusResponse* /*response*/) override {
    return FinishUnimplemented(context, "tandem.v1.RolloutService/GetAdapterStatus");
  }
};

}  // namespace tandem::rollout

#endif  // TANDEM_SERVICES_ROLLOUT_ROLLOUT_SERVICE_H_
