#ifndef TANDEM_SERVICES_TRAINER_SERVICE_DIALER_H_
#define TANDEM_SERVICES_TRAINER_SERVICE_DIALER_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/channel.h"
#include "services/weight_store/client/adapter_client.h"
#include "tandem/rollout/v1/rollout.grpc.pb.h"
#include "tandem/routerreplay/v1/router_replay.grpc.pb.h"

namespace tandem::trainer {

// Opens the stubs a job run calls, by the addresses the trainer is configured with. The trainer
// dials gRPC channels (GrpcServiceDialer); tests hand out fakes or in-process servers.
class ServiceDialer {
 public:
  virtual ~ServiceDialer() = default;
  virtual absl::StatusOr<std::unique_ptr<rollout::v1::RolloutService::StubInterface>> Rollout(
      const std::string& address) = 0;
  virtual absl::StatusOr<std::unique_ptr<weight_store::WeightStoreStubs>> WeightStore(
      const std::string& address) = 0;
  virtual absl::StatusOr<std::unique_ptr<routerreplay::v1::RouterReplayService::StubInterface>>
  RouterReplay(const std::string& address) = 0;
};

// gRPC channels (CreateChannel: retries, keepalive) carrying the bearer token.
class GrpcServiceDialer final : public ServiceDialer {
 public:
  GrpcServiceDialer(std::string auth_token, std::string auth_token_file,
                    std::optional<ClientTls> tls)
      : auth_token_(std::move(auth_token)),
        auth_token_file_(std::move(auth_token_file)),
        tls_(std::move(tls)) {}
  absl::StatusOr<std::unique_ptr<rollout::v1::RolloutService::StubInterface>> Rollout(
      const std::string& address) override;
  absl::StatusOr<std::unique_ptr<weight_store::WeightStoreStubs>> WeightStore(
      const std::string& address) override;
  absl::StatusOr<std::unique_ptr<routerreplay::v1::RouterReplayService::StubInterface>>
  RouterReplay(const std::string& address) override;

 private:
  const std::string auth_token_;
  const std::string auth_token_file_;
  const std::optional<ClientTls> tls_;  // Unset: plaintext.
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_SERVICE_DIALER_H_
