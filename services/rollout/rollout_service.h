#ifndef TANDEM_SERVICES_ROLLOUT_ROLLOUT_SERVICE_H_
#define TANDEM_SERVICES_ROLLOUT_ROLLOUT_SERVICE_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/call_tracker.h"
#include "engine/model.h"
#include "engine/text/text_codec.h"
#include "engine/transformer.h"
#include "grpcpp/channel.h"
#include "services/rollout/adapter_registry.h"
#include "services/rollout/scheduler.h"
#include "services/router_replay/client/route_appender.h"
#include "tandem/rollout/v1/rollout.grpc.pb.h"
#include "transfer/ucx_transport.h"

namespace tandem::rollout {

struct RolloutOptions {
  // A Hugging Face model directory or an engine safetensors file (engine::hf::LoadBaseModel).
  std::string base_model_path;
  engine::Precision precision = engine::Precision::kBF16;
  // Where generation computes: "cpu", or "cuda" / "cuda:N" (fp32 or bf16).
  std::string device = "cpu";
  // Channels to the other services; null: requests that need them fail clearly.
  std::shared_ptr<grpc::Channel> weight_store;
  std::shared_ptr<grpc::Channel> router_replay;
  // Adapters followed from the start; the replica is NOT_SERVING until the newest version of
  // each (at start) is loaded.
  std::vector<std::string> adapters;
  bool enable_ucx = true;
  transfer::UcxOptions ucx;
  AdapterRegistryOptions registry;
  SchedulerOptions scheduler;
  router_replay::RouteAppenderOptions routes;
  // On drain: how long Generate streams may take to end (each has all its samples by then,
  // most cut short), and how long the server then waits before closing connections.
  absl::Duration drain_wait = absl::Seconds(10);
  absl::Duration drain_linger = absl::Milliseconds(200);
};

// gRPC front end of the rollout service: Generate streams each finished sample; GetAdapterStatus
// reports the registry. The base model is loaded in Create; Ready() gates health.
class RolloutServiceImpl final : public rollout::v1::RolloutService::CallbackService {
 public:
  static absl::StatusOr<std::unique_ptr<RolloutServiceImpl>> Create(RolloutOptions options);
  ~RolloutServiceImpl() override;

  grpc::ServerWriteReactor<rollout::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const rollout::v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* GetAdapterStatus(
      grpc::CallbackServerContext* context, const rollout::v1::GetAdapterStatusRequest* request,
      rollout::v1::GetAdapterStatusResponse* response) override;
  grpc::ServerWriteReactor<rollout::v1::WatchAdapterStatusResponse>* WatchAdapterStatus(
      grpc::CallbackServerContext* context,
      const rollout::v1::WatchAdapterStatusRequest* request) override;

  // Base model loaded and every followed adapter's starting version servable.
  bool Ready() const { return registry_->Ready(); }
  // For a server drain: ends WatchAdapterStatus streams (UNAVAILABLE) and running samples early
  // (FINISH_REASON_CANCELLED, tokens so far), waits up to options.drain_wait for the streams to
  // end, then options.drain_linger more so clients read the last responses before the server closes
  // their connections.
  void Drain();
  const engine::ModelConfig& model_config() const { return base_->config(); }

 private:
  explicit RolloutServiceImpl(RolloutOptions options);

  RolloutOptions options_;
  const std::string replica_id_;
  std::unique_ptr<engine::BaseModel> base_;
  std::unique_ptr<engine::text::TextCodec> codec_;  // The base model's prompts and stop ids.
  std::unique_ptr<transfer::UcxWorker> ucx_;
  std::unique_ptr<router_replay::RouteAppender> appender_;
  std::unique_ptr<AdapterRegistry> registry_;
  std::atomic<Scheduler*> scheduler_for_wakeups_{nullptr};
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<SchedulerThread> scheduler_thread_;
  CallTracker streams_;  // Generate calls in progress.
};

}  // namespace tandem::rollout

#endif  // TANDEM_SERVICES_ROLLOUT_ROLLOUT_SERVICE_H_
