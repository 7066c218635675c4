#include "services/trainer/job/service_dialer.h"

namespace tandem::trainer {
namespace {

template <typename Service>
absl::StatusOr<std::unique_ptr<typename Service::StubInterface>> Dial(
    const std::string& address, const std::string& service_name, const std::string& auth_token,
    const std::string& auth_token_file, const std::optional<ClientTls>& tls) {
  auto channel = CreateChannel({.target = address,
                                .service_name = service_name,
                                .auth_token = auth_token,
                                .auth_token_file = auth_token_file,
                                .tls = tls});
  if (!channel.ok()) return channel.status();
  return std::unique_ptr<typename Service::StubInterface>(Service::NewStub(*channel));
}

}  // namespace

absl::StatusOr<std::unique_ptr<rollout::v1::RolloutService::StubInterface>>
GrpcServiceDialer::Rollout(const std::string& address) {
  return Dial<rollout::v1::RolloutService>(address, "tandem.rollout.v1.RolloutService", auth_token_,
                                           auth_token_file_, tls_);
}

absl::StatusOr<std::unique_ptr<weight_store::WeightStoreStubs>> GrpcServiceDialer::WeightStore(
    const std::string& address) {
  auto channel = CreateChannel({.target = address,
                                .service_name = "tandem.weightstore.v1.WeightStoreService",
                                .also_services = {weight_store::kUcxServiceName},
                                .auth_token = auth_token_,
                                .auth_token_file = auth_token_file_,
                                .tls = tls_});
  if (!channel.ok()) return channel.status();
  return std::make_unique<weight_store::WeightStoreStubs>(*channel);
}

absl::StatusOr<std::unique_ptr<routerreplay::v1::RouterReplayService::StubInterface>>
GrpcServiceDialer::RouterReplay(const std::string& address) {
  return Dial<routerreplay::v1::RouterReplayService>(
      address, "tandem.routerreplay.v1.RouterReplayService", auth_token_, auth_token_file_, tls_);
}

}  // namespace tandem::trainer
