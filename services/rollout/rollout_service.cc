#include "services/rollout/rollout_service.h"

#include <chrono>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/call_tracker.h"
#include "common/finished_reactor.h"
#include "common/logging.h"
#include "common/queued_write_reactor.h"
#include "common/status.h"
#include "common/unary.h"
#include "engine/cuda/device_engines.h"
#include "engine/hf/hf_model.h"
#include "services/rollout/adapter_status_watch.h"
#include "services/rollout/generate_request.h"
#include "tandem/weightstore/v1/weight_store.grpc.pb.h"

namespace tandem::rollout {
namespace {

std::string NewReplicaId() {
  std::random_device random;
  return absl::StrFormat("rollout-%08x%08x", random(), random());
}

absl::Time DeadlineOf(const grpc::CallbackServerContext& context) {
  const auto deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(deadline);
}

// Streams a request's samples as the scheduler finishes them, then ends OK after the last.
class GenerateReactor final : public QueuedWriteReactor<rollout::v1::GenerateResponse> {
 public:
  GenerateReactor(grpc::CallbackServerContext* context, Scheduler& scheduler, CallTracker& streams,
                  std::unique_ptr<GenerationWork> work)
      : scheduler_(scheduler), stream_(streams), expected_(work->num_samples()) {
    work->start = absl::Now();
    work->deadline = DeadlineOf(*context);
    work->deliver = [sink = sink()](rollout::v1::GenerateResponse response) {
      sink->Write(std::move(response));
    };
    work->fail = [sink = sink()](const absl::Status& status) {
      sink->Finish(ToGrpcStatus(status));
    };
    work_ = std::move(work);
    absl::Duration retry_after;
    if (absl::Status status = scheduler_.Submit(work_, &retry_after); !status.ok()) {
      if (absl::IsResourceExhausted(status)) {
        // gRPC's own retry pushback: clients with a retry policy wait this long.
        context->AddTrailingMetadata("grpc-retry-pushback-ms",
                                     absl::StrCat(absl::ToInt64Milliseconds(retry_after)));
      }
      sink()->Finish(ToGrpcStatus(status));
    }
  }

 private:
  bool IsLast(const rollout::v1::GenerateResponse& /*response*/) override {
    return ++written_ == expected_;
  }

  // The scheduler drops the request's samples and frees their KV cache.
  void OnClientGone() override {
    work_->cancelled = true;
    scheduler_.Wake();
  }

  Scheduler& scheduler_;
  const CallTracker::Token stream_;  // Until the reactor is done.
  const int expected_;
  int written_ = 0;
  std::shared_ptr<GenerationWork> work_;
};

}  // namespace

RolloutServiceImpl::RolloutServiceImpl(RolloutOptions options)
    : options_(std::move(options)), replica_id_(NewReplicaId()) {}

RolloutServiceImpl::~RolloutServiceImpl() {
  scheduler_for_wakeups_ = nullptr;
  scheduler_thread_.reset();
  scheduler_.reset();  // Before the registry whose models it runs.
  registry_.reset();
  appender_.reset();
}

absl::StatusOr<std::unique_ptr<RolloutServiceImpl>> RolloutServiceImpl::Create(
    RolloutOptions options) {
  std::unique_ptr<RolloutServiceImpl> service(new RolloutServiceImpl(std::move(options)));
  const RolloutOptions& o = service->options_;
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
  service->base_ = std::make_unique<engine::BaseModel>(
      o.precision == engine::Precision::kF32 ? *std::move(base) : base->ForPrecision(o.precision));
  auto codec = engine::text::TextCodecFor(o.base_model_path);
  if (!codec.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot load the base model's tokenizer: ", codec.status().message()));
  }
  service->codec_ = *std::move(codec);
  if (!o.adapters.empty() && o.weight_store == nullptr) {
    return absl::InvalidArgumentError("--adapter needs --weight_store");
  }
  absl::StatusOr<engine::DecodeEngineMaker> make_engine =
      engine::MakeDecodeEngineMaker(o.device, o.precision);
  if (!make_engine.ok()) return make_engine.status();
  auto base_model = std::make_shared<ServedModel>();
  absl::StatusOr<std::unique_ptr<engine::DecodeEngine>> base_engine =
      (*make_engine)(*service->base_, nullptr);
  if (!base_engine.ok()) return base_engine.status();
  base_model->engine = *std::move(base_engine);
  base_model->ready_time = absl::Now();
  AdapterRegistryOptions registry = o.registry;
  registry.loader.precision = o.precision;
  registry.loader.make_engine = *std::move(make_engine);
  registry.loader.holder = service->replica_id_;
  if (o.enable_ucx && o.weight_store != nullptr) {
    auto ucx = transfer::UcxWorker::Create(o.ucx);
    if (ucx.ok()) {
      service->ucx_ = *std::move(ucx);
      registry.loader.ucx = service->ucx_.get();
    } else {
      spdlog::warn("UCX unavailable ({}); adapters are fetched over gRPC", ucx.status().ToString());
    }
  }
  if (o.router_replay != nullptr) {
    service->appender_ = std::make_unique<router_replay::RouteAppender>(o.router_replay, o.routes);
  }
  RolloutServiceImpl* raw = service.get();
  service->registry_ = std::make_unique<AdapterRegistry>(
      *service->base_, std::move(base_model),
      o.weight_store == nullptr ? nullptr
                                : std::make_unique<weight_store::WeightStoreStubs>(o.weight_store),
      registry, [raw] {
        if (Scheduler* scheduler = raw->scheduler_for_wakeups_.load()) scheduler->Wake();
      });
  for (const std::string& adapter : o.adapters) service->registry_->Follow(adapter, true);
  service->scheduler_ = std::make_unique<Scheduler>(
      *service->registry_, std::make_unique<EngineBatch>(*service->registry_->base_model()->engine),
      service->appender_.get(), service->base_->config(), o.scheduler);
  service->scheduler_for_wakeups_ = service->scheduler_.get();
  service->scheduler_thread_ = std::make_unique<SchedulerThread>(*service->scheduler_);
  return service;
}

void RolloutServiceImpl::Drain() {
  registry_->status_listeners().EndAll();
  scheduler_->Drain();
  if (!streams_.WaitUntilIdle(options_.drain_wait)) {
    spdlog::warn("rollout drain: Generate streams still open after {}",
                 absl::FormatDuration(options_.drain_wait));
  }
  // A connection closed right after a stream's last response can reach the client as a reset
  // that discards responses it had not read yet.
  absl::SleepFor(options_.drain_linger);
}

grpc::ServerWriteReactor<rollout::v1::GenerateResponse>* RolloutServiceImpl::Generate(
    grpc::CallbackServerContext* context, const rollout::v1::GenerateRequest* request) {
  // Health says NOT_SERVING until then; a client that calls anyway must not get samples of
  // stale weights, nor wait on a load that may never come.
  if (!Ready()) {
    return new FinishedReactor<grpc::ServerWriteReactor<rollout::v1::GenerateResponse>>(
        grpc::Status(
            grpc::StatusCode::UNAVAILABLE,
            "rollout replica is not yet serving current weights (its --adapter versions are still "
            "loading); retry later"));
  }
  absl::StatusOr<std::unique_ptr<GenerationWork>> work =
      PrepareWork(*request, model_config(), *codec_);
  if (!work.ok()) {
    return new FinishedReactor<grpc::ServerWriteReactor<rollout::v1::GenerateResponse>>(
        ToGrpcStatus(work.status()));
  }
  return new GenerateReactor(context, *scheduler_, streams_, *std::move(work));
}

grpc::ServerUnaryReactor* RolloutServiceImpl::GetAdapterStatus(
    grpc::CallbackServerContext* context, const rollout::v1::GetAdapterStatusRequest* request,
    rollout::v1::GetAdapterStatusResponse* response) {
  absl::StatusOr<std::vector<rollout::v1::AdapterStatus>> adapters =
      registry_->Status(request->adapter_name());
  if (!adapters.ok()) {
    return FinishUnary<rollout::v1::GetAdapterStatusResponse>(context, adapters.status(), response);
  }
  rollout::v1::GetAdapterStatusResponse result;
  result.set_replica_id(replica_id_);
  result.mutable_adapters()->Add(adapters->begin(), adapters->end());
  return FinishUnary<rollout::v1::GetAdapterStatusResponse>(context, std::move(result), response);
}

grpc::ServerWriteReactor<rollout::v1::WatchAdapterStatusResponse>*
RolloutServiceImpl::WatchAdapterStatus(grpc::CallbackServerContext* /*context*/,
                                       const rollout::v1::WatchAdapterStatusRequest* request) {
  using Finished =
      FinishedReactor<grpc::ServerWriteReactor<rollout::v1::WatchAdapterStatusResponse>>;
  if (request->adapter_name().empty()) {
    return new Finished(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                     "adapter_name is required: the adapter to watch"));
  }
  if (absl::Status followed = registry_->Status(request->adapter_name()).status(); !followed.ok()) {
    return new Finished(ToGrpcStatus(followed));
  }
  return new AdapterStatusWatch(*registry_, request->adapter_name(), replica_id_);
}

}  // namespace tandem::rollout
