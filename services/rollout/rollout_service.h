#ifndef TANDEM_SERVICES_ROLLOUT_ROLLOUT_SERVICE_H_
#define TANDEM_SERVICES_ROLLOUT_ROLLOUT_SERVICE_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "common/call_tracker.h"
#include "common/server.h"
#include "services/rollout/rollout_replica.h"
#include "tandem/rollout/v1/rollout.grpc.pb.h"

namespace tandem::rollout {

// gRPC front end of a rollout replica: validates requests and converts them for the core
// (RolloutReplica), streams each finished sample of Generate, reports and streams adapter status.
class RolloutServiceImpl final : public rollout::v1::RolloutService::CallbackService {
 public:
  explicit RolloutServiceImpl(std::unique_ptr<RolloutReplica> replica)
      : replica_(std::move(replica)) {}

  grpc::ServerWriteReactor<rollout::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const rollout::v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* GetAdapterStatus(
      grpc::CallbackServerContext* context, const rollout::v1::GetAdapterStatusRequest* request,
      rollout::v1::GetAdapterStatusResponse* response) override;
  grpc::ServerWriteReactor<rollout::v1::WatchAdapterStatusResponse>* WatchAdapterStatus(
      grpc::CallbackServerContext* context,
      const rollout::v1::WatchAdapterStatusRequest* request) override;

  // Health: the replica is Ready.
  bool Ready() const { return replica_->Ready(); }
  // For a server drain: drains the replica, waits up to drain_wait for the Generate streams to
  // end, then drain_linger more so clients read the last responses before the server closes
  // their connections.
  void Drain();
  RolloutReplica& replica() { return *replica_; }

 private:
  const std::unique_ptr<RolloutReplica> replica_;
  CallTracker streams_;  // Generate calls in progress.
};

// What a rollout server hosts for `replica`: RolloutService (ready once the replica is, drained
// with it) and, when the replica relays (RolloutOptions::relay), AdapterRelayService.
std::vector<HostedService> RolloutServices(std::unique_ptr<RolloutReplica> replica);

}  // namespace tandem::rollout

#endif  // TANDEM_SERVICES_ROLLOUT_ROLLOUT_SERVICE_H_
