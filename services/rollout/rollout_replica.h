#ifndef TANDEM_SERVICES_ROLLOUT_ROLLOUT_REPLICA_H_
#define TANDEM_SERVICES_ROLLOUT_ROLLOUT_REPLICA_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/model.h"
#include "engine/text/text_codec.h"
#include "engine/transformer.h"
#include "grpcpp/channel.h"
#include "services/rollout/adapter_registry.h"
#include "services/rollout/scheduler.h"
#include "services/router_replay/client/route_appender.h"
#include "services/weight_store/client/adapter_relay.h"
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
  // Relays every adapter version it fetches to other replicas as the bytes arrive
  // (AdapterRelayService, served beside RolloutService): versions then come by the gRPC stream,
  // from `relay_from` (the previous replica of a chain) or, when it is null or fails, the
  // weight-store; never by UCX.
  bool relay = false;
  std::shared_ptr<grpc::Channel> relay_from;
  AdapterRegistryOptions registry;
  SchedulerOptions scheduler;
  router_replay::RouteAppenderOptions routes;
  // On drain: how long Generate streams may take to end (each has all its samples by then,
  // most cut short), and how long the server then waits before closing connections.
  absl::Duration drain_wait = absl::Seconds(10);
  absl::Duration drain_linger = absl::Milliseconds(200);
};

// One rollout replica, the core the gRPC front end (RolloutServiceImpl) serves: the base model in
// its serving precision and its tokenizer, the adapters it follows (AdapterRegistry, fed by
// weight-store), route recording (RouteAppender to router-replay) and continuous batching
// (Scheduler, stepped on its own thread). Built from options, before and apart from any server.
class RolloutReplica {
 public:
  // Loads the base model and tokenizer (FAILED_PRECONDITION), opens the device
  // (FAILED_PRECONDITION for one that cannot serve), starts following options.adapters.
  static absl::StatusOr<std::unique_ptr<RolloutReplica>> Create(RolloutOptions options);
  // Stops loading adapters, then the scheduler, then releases the registry.
  ~RolloutReplica();

  // Every followed adapter's starting version servable.
  bool Ready() const { return registry_->Ready(); }
  // Ends WatchAdapterStatus streams (UNAVAILABLE) and running samples early
  // (FINISH_REASON_CANCELLED, tokens so far); new requests are UNAVAILABLE from now on.
  void Drain();

  const RolloutOptions& options() const { return options_; }
  // Identifies this replica (in status responses); new after each start.
  const std::string& id() const { return id_; }
  const engine::ModelConfig& model_config() const { return base_->config(); }
  const engine::text::TextCodec& codec() const { return *codec_; }
  AdapterRegistry& registry() { return *registry_; }
  // What this replica relays; null unless options.relay.
  weight_store::RelayedVersions* relayed() { return relayed_.get(); }
  Scheduler& scheduler() { return *scheduler_; }

 private:
  explicit RolloutReplica(RolloutOptions options);
  // The registry over the base model's engine, its loader set up for the device and UCX.
  absl::Status CreateRegistry();

  const RolloutOptions options_;
  const std::string id_;
  std::unique_ptr<engine::BaseModel> base_;
  std::unique_ptr<engine::text::TextCodec> codec_;
  std::unique_ptr<transfer::UcxWorker> ucx_;
  // Outlive the registry, whose loads use them.
  std::unique_ptr<weight_store::RelayedVersions> relayed_;
  std::unique_ptr<internal::v1::AdapterRelayService::Stub> relay_from_;
  std::unique_ptr<router_replay::RouteAppender> appender_;
  std::unique_ptr<AdapterRegistry> registry_;
  // Set before any adapter is followed, so staging (which only followed adapters do) always
  // finds it; the registry stops loading before it goes.
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<SchedulerThread> scheduler_thread_;
};

}  // namespace tandem::rollout

#endif  // TANDEM_SERVICES_ROLLOUT_ROLLOUT_REPLICA_H_
