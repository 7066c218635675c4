#include "services/rollout/rollout_replica.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/status.h"
#include "engine/cuda/device_engines.h"
#include "engine/hf/hf_model.h"
#include "services/weight_store/client/engine_lora.h"

namespace tandem::rollout {
namespace {

std::string NewReplicaId() {
  std::random_device random;
  return absl::StrFormat("rollout-%08x%08x", random(), random());
}

}  // namespace

RolloutReplica::RolloutReplica(RolloutOptions options)
    : options_(std::move(options)), id_(NewReplicaId()) {}

RolloutReplica::~RolloutReplica() {
  if (registry_ != nullptr) registry_->StopLoading();  // No more wake-ups of the scheduler.
  scheduler_thread_.reset();
  scheduler_.reset();  // Before the registry whose models it runs.
  registry_.reset();
  appender_.reset();
}

absl::StatusOr<std::unique_ptr<RolloutReplica>> RolloutReplica::Create(RolloutOptions options) {
  std::unique_ptr<RolloutReplica> replica(new RolloutReplica(std::move(options)));
  const RolloutOptions& o = replica->options_;
  if (!o.adapters.empty() && o.weight_store == nullptr) {
    return InvalidRequest("INVALID_FLAG", "--adapter needs --weight_store");
  }
  const absl::Time load_start = absl::Now();
  auto base = engine::hf::LoadBaseModel(o.base_model_path);
  if (!base.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot load the base model: ", base.status().message()));
  }
  spdlog::info("base model {} loaded in {}: {} layers ({} MoE, {} experts, top-{}), vocab {}",
               o.base_model_path, absl::FormatDuration(absl::Now() - load_start),
               base->config().num_layers, base->config().num_moe_layers(),
               base->config().num_experts, base->config().top_k, base->config().vocab_size);
  replica->base_ = std::make_unique<engine::BaseModel>(
      o.precision == engine::Precision::kF32 ? *std::move(base) : base->ForPrecision(o.precision));
  auto codec = engine::text::TextCodecFor(o.base_model_path);
  if (!codec.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot load the base model's tokenizer: ", codec.status().message()));
  }
  replica->codec_ = *std::move(codec);
  if (o.router_replay != nullptr) {
    replica->appender_ = std::make_unique<router_replay::RouteAppender>(o.router_replay, o.routes);
  }
  if (absl::Status status = replica->CreateRegistry(); !status.ok()) return status;
  replica->scheduler_ = std::make_unique<Scheduler>(
      *replica->registry_, std::make_unique<EngineBatch>(*replica->registry_->base_model()->engine),
      replica->appender_.get(), replica->base_->config(), o.scheduler);
  replica->scheduler_thread_ = std::make_unique<SchedulerThread>(*replica->scheduler_);
  for (const std::string& adapter : o.adapters) replica->registry_->Follow(adapter, true);
  return replica;
}

absl::Status RolloutReplica::CreateRegistry() {
  const RolloutOptions& o = options_;
  absl::StatusOr<engine::DecodeEngineMaker> make_engine =
      engine::MakeDecodeEngineMaker(o.device, o.precision);
  if (!make_engine.ok()) return make_engine.status();
  auto base_model = std::make_shared<ServedModel>();
  absl::StatusOr<std::unique_ptr<engine::DecodeEngine>> base_engine =
      (*make_engine)(*base_, nullptr);
  if (!base_engine.ok()) return base_engine.status();
  base_model->engine = *std::move(base_engine);
  base_model->ready_time = absl::Now();
  AdapterRegistryOptions registry = o.registry;
  registry.loader.precision = o.precision;
  registry.loader.make_engine = *std::move(make_engine);
  registry.loader.holder = id_;
  if (o.relay) {
    relayed_ = std::make_unique<weight_store::RelayedVersions>(weight_store::EngineTargetLayout());
    registry.loader.relayed = relayed_.get();
    if (o.relay_from != nullptr) {
      relay_from_ = internal::v1::AdapterRelayService::NewStub(o.relay_from);
      registry.loader.relay_from = relay_from_.get();
    }
  } else if (o.enable_ucx && o.weight_store != nullptr) {
    auto ucx = transfer::UcxWorker::Create(o.ucx);
    if (ucx.ok()) {
      ucx_ = *std::move(ucx);
      registry.loader.ucx = ucx_.get();
    } else {
      spdlog::warn("UCX unavailable ({}); adapters are fetched over gRPC", ucx.status().ToString());
    }
  }
  registry_ = std::make_unique<AdapterRegistry>(
      *base_, std::move(base_model),
      o.weight_store == nullptr ? nullptr
                                : std::make_unique<weight_store::WeightStoreStubs>(o.weight_store),
      registry, [this] { scheduler_->Wake(); });
  return absl::OkStatus();
}

void RolloutReplica::Drain() {
  registry_->status_listeners().EndAll();
  scheduler_->Drain();
}

}  // namespace tandem::rollout
