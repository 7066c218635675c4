#include "services/trainer/job_run.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <future>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/channel.h"
#include "common/logging.h"
#include "common/status.h"
#include "engine/cuda/device_engines.h"
#include "engine/hf/hf_model.h"
#include "engine/module_names.h"
#include "engine/peft_adapter.h"
#include "engine/sampler.h"
#include "engine/tasks.h"
#include "engine/text/text_codec.h"
#include "services/rollout/client/sampling_rules.h"
#include "services/router_replay/client/replay_fetch.h"
#include "services/trainer/checkpoint.h"
#include "services/trainer/job_spec.h"
#include "services/trainer/policy_update.h"
#include "services/trainer/service_endpoints.h"
#include "services/trainer/task_source.h"
#include "services/trainer/version_pin.h"
#include "services/weight_store/client/adapter_client.h"
#include "services/weight_store/client/engine_lora.h"
#include "tandem/v1/rollout.grpc.pb.h"
#include "tandem/v1/router_replay.grpc.pb.h"
#include "tandem/v1/weight_store.grpc.pb.h"

namespace tandem::trainer {
namespace {

template <typename Service>
absl::StatusOr<std::unique_ptr<typename Service::StubInterface>> Dial(
    const std::string& address, const std::string& service_name, const std::string& auth_token,
    const std::optional<ClientTls>& tls) {
  auto channel = CreateChannel(
      {.target = address, .service_name = service_name, .auth_token = auth_token, .tls = tls});
  if (!channel.ok()) return channel.status();
  return std::unique_ptr<typename Service::StubInterface>(Service::NewStub(*channel));
}

double SecondsSince(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

absl::Status Cancelled() { return absl::CancelledError("job cancelled"); }

// The longest wait between two tries of a store that is restarting.
constexpr absl::Duration kMaxStoreBackoff = absl::Seconds(5);
// How often a run waiting out a store's backoff looks whether it was cancelled.
constexpr absl::Duration kCancelCheckInterval = absl::Milliseconds(50);

// A non-finite loss, gradient norm or LoRA parameter fails the step: training on would publish
// a broken adapter and end the job SUCCEEDED.
absl::Status CheckFinite(int64_t step, const UpdateStats& stats, const engine::LoraAdapter& lora) {
  if (!std::isfinite(stats.loss) || !std::isfinite(stats.grad_norm)) {
    return absl::InternalError(absl::StrCat("step ", step, ": loss ", stats.loss,
                                            ", gradient norm ", stats.grad_norm,
                                            "; not publishing a diverged adapter"));
  }
  for (const std::string& name : lora.parameters().names()) {
    const std::vector<float>& values = lora.parameters().Find(name)->value;
    if (!std::all_of(values.begin(), values.end(), [](float v) { return std::isfinite(v); })) {
      return absl::InternalError(absl::StrCat("step ", step, ": LoRA tensor ", name,
                                              " holds non-finite values after the update"));
    }
  }
  return absl::OkStatus();
}

// Whether two LoRA configs compute alike: targets compare as sets (PEFT keeps them as a set).
bool SameLora(const engine::LoraConfig& a, const engine::LoraConfig& b) {
  const std::set<std::string> a_targets(a.targets.begin(), a.targets.end());
  const std::set<std::string> b_targets(b.targets.begin(), b.targets.end());
  return a.rank == b.rank && a.alpha == b.alpha && a.expert_layout == b.expert_layout &&
         a_targets == b_targets;
}

engine::ScheduleConfig ScheduleOf(const v1::JobSpec& spec) {
  const v1::AlgorithmConfig& algorithm = spec.algorithm_config();
  const v1::LearningRateSchedule& schedule = algorithm.lr_schedule();
  const auto peak = static_cast<float>(algorithm.learning_rate());
  return {.peak_lr = peak,
          .min_lr = static_cast<float>(peak * schedule.min_lr_ratio()),
          .warmup_steps = schedule.warmup_updates(),
          .total_steps = std::max<int64_t>(1, spec.num_steps() * algorithm.updates_per_step()),
          .decay = schedule.decay() == v1::LR_DECAY_LINEAR   ? engine::LrDecay::kLinear
                   : schedule.decay() == v1::LR_DECAY_COSINE ? engine::LrDecay::kCosine
                                                             : engine::LrDecay::kConstant};
}

PolicyUpdateConfig UpdateConfigOf(const v1::JobSpec& spec) {
  const v1::AlgorithmConfig& algorithm = spec.algorithm_config();
  const v1::IsCorrection& correction = spec.is_correction();
  PolicyUpdateConfig config;
  config.baseline =
      spec.algorithm() == v1::ALGORITHM_DR_GRPO ? GroupBaseline::kDrGrpo : GroupBaseline::kGrpo;
  // The value head itself is the run's; Run points the critic at it.
  config.critic = {.learning_rate = static_cast<float>(algorithm.value_learning_rate()),
                   .gamma = algorithm.gamma(),
                   .lambda = algorithm.gae_lambda(),
                   .truncated_gae = algorithm.truncated_gae(),
                   .loss_coef = algorithm.value_loss_coef(),
                   .value_clip = algorithm.value_clip()};
  config.whiten_advantages = algorithm.whiten_advantages();
  config.loss = {
      .clip_low = algorithm.clip_eps_low(),
      .clip_high = algorithm.clip_eps_high(),
      .dual_clip_c = algorithm.dual_clip_c(),
      .aggregation = algorithm.loss_aggregation() == v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_SUM
                         ? Aggregation::kSeqMeanTokenSum
                     : algorithm.loss_aggregation() == v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_MEAN
                         ? Aggregation::kSeqMeanTokenMean
                         : Aggregation::kTokenMean,
      .kl_coef = algorithm.kl_coef(),
      .kl_estimator = algorithm.kl_estimator() == v1::KL_ESTIMATOR_K1   ? KlEstimator::kK1
                      : algorithm.kl_estimator() == v1::KL_ESTIMATOR_K2 ? KlEstimator::kK2
                                                                        : KlEstimator::kK3};
  switch (correction.mode()) {
    case v1::IS_CORRECTION_MODE_TOKEN_TIS:
      config.is.mode = IsMode::kTokenTis;
      break;
    case v1::IS_CORRECTION_MODE_SEQUENCE_TIS:
      config.is.mode = IsMode::kSequenceTis;
      break;
    case v1::IS_CORRECTION_MODE_ICEPOP:
      config.is.mode = IsMode::kIcePop;
      break;
    case v1::IS_CORRECTION_MODE_REJECTION:
      config.is.mode = IsMode::kRejection;
      break;
    default:
      config.is.mode = IsMode::kNone;
  }
  config.is.upper = correction.upper_bound();
  config.is.lower = correction.lower_bound();
  config.is.level = correction.rejection_level() == v1::REJECTION_LEVEL_SEQUENCE
                        ? RejectionLevel::kSequence
                        : RejectionLevel::kToken;
  config.replay = spec.routing_replay() == v1::ROUTING_REPLAY_MODE_OFF  ? RouteReplay::kOff
                  : spec.routing_replay() == v1::ROUTING_REPLAY_MODE_R2 ? RouteReplay::kR2
                                                                        : RouteReplay::kR3;
  config.updates_per_step = algorithm.updates_per_step();
  config.micro_batch_size = spec.micro_batch_size();
  config.schedule = ScheduleOf(spec);
  config.max_grad_norm = static_cast<float>(algorithm.max_grad_norm());
  const float temperature = spec.sampling().has_temperature() ? spec.sampling().temperature() : 1;
  config.temperature = temperature > 0 ? temperature : 1;
  return config;
}

// One step's samples as generated, and how they scored.
struct StepSamples {
  std::vector<v1::GenerateResponse> responses;  // prompt-major
  std::vector<TrainingSample> training;
  double accuracy = 0, reward_mean = 0, length_mean = 0, truncated_share = 0;
  double partial_share = 0;  // Samples that switched to a newer version mid-generation.
};

class JobRun {
 public:
  JobRun(const v1::Job& job, const JobEnvironment& environment)
      : job_(job),
        spec_(job.spec()),
        environment_(environment),
        owner_{.job_id = job.id(), .spec_fingerprint = SpecFingerprint(job.spec())} {}

  absl::Status Init();
  absl::Status Run(const JobProgress& progress, const std::atomic<bool>& cancelled);

 private:
  // Cancels the Generate calls in flight and any later attempt (the run is ending).
  void AbandonGeneration();
  bool Abandoned() {
    absl::MutexLock lock(&calls_mutex_);
    return abandoned_;
  }

  void SetDeadline(grpc::ClientContext& context) const {
    SetTimeout(context, environment_.rpc_timeout);
  }
  // The checkpoint the run starts from: the job's own in output_dir (a resume from its step,
  // which start_step_ takes), else initial_checkpoint_dir's (a start at step 1 that owner_
  // records), else none. Another job's checkpoint in output_dir is refused, never resumed.
  absl::StatusOr<std::optional<Checkpoint>> StartingCheckpoint();
  // A new job's adapter: the spec's initial PEFT adapter, else A random and B zero.
  absl::StatusOr<engine::LoraAdapter> InitialAdapter() const;
  // The value head and its optimizer from a PPO job's checkpoint; DATA_LOSS if it has none.
  absl::Status RestoreCritic(const std::optional<CriticState>& critic);
  absl::StatusOr<int64_t> NewestVersion();
  // Calls `call` (with its attempt number) until it returns anything but UNAVAILABLE or
  // RESOURCE_EXHAUSTED, `store` has been unavailable for longer than the environment's
  // store_outage_budget, or the run is cancelled (CANCELLED).
  absl::Status RideOutOutage(absl::string_view store,
                             const std::function<absl::Status(int attempt)>& call);
  absl::Status Publish(int64_t version, int64_t step);
  absl::Status AwaitSwap(int64_t version);
  absl::StatusOr<StepSamples> Generate(int64_t step, int64_t version);
  // One attempt at a step's samples from every replica, prompt-major, for the prompts' ids. A
  // replica's share larger than a request holds goes as several requests.
  absl::StatusOr<std::vector<v1::GenerateResponse>> RequestSamples(
      int64_t step, int64_t version, int attempt, const std::vector<std::vector<int>>& prompts);
  // The request for prompts [first, end) of a step, which keep their step-wide ids.
  v1::GenerateRequest GenerateRequestFor(int64_t step, int64_t version, int attempt, int first,
                                         int end, const std::vector<std::vector<int>>& prompt_ids);
  absl::StatusOr<std::vector<v1::GenerateResponse>> GenerateOn(
      v1::RolloutService::StubInterface& stub, const v1::GenerateRequest& request);
  absl::StatusOr<std::vector<int16_t>> FetchRoutes(const StepSamples& samples,
                                                   double* missing_share);

  const v1::Job job_;
  const v1::JobSpec& spec_;
  const JobEnvironment environment_;
  std::unique_ptr<engine::BaseModel> base_;
  std::string base_architecture_;  // config.json's, "" for an engine file; names PEFT modules.
  std::unique_ptr<engine::text::TextCodec> codec_;  // As rollout's: prompts sent as their ids.
  std::unique_ptr<engine::Task> task_;
  std::unique_ptr<engine::LoraAdapter> lora_;
  std::optional<engine::AdamW> optimizer_;
  std::optional<ValueHead> value_head_;  // PPO's critic, with an optimizer of its own.
  std::optional<engine::AdamW> critic_optimizer_;
  std::vector<std::string> rollout_addresses_;  // One per replica, as rollouts_.
  std::vector<std::unique_ptr<v1::RolloutService::StubInterface>> rollouts_;
  std::unique_ptr<v1::WeightStoreService::StubInterface> weight_store_;
  std::unique_ptr<v1::RouterReplayService::StubInterface> router_replay_;
  int64_t start_step_ = 0;
  CheckpointOwner owner_;                         // What the run's checkpoints record.
  const std::atomic<bool>* cancelled_ = nullptr;  // Set by Run.
  absl::Mutex calls_mutex_;
  absl::flat_hash_set<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(calls_mutex_);
  bool abandoned_ ABSL_GUARDED_BY(calls_mutex_) = false;
};

absl::Status JobRun::Init() {
  auto base = engine::hf::LoadBaseModel(spec_.base_model_path());
  if (!base.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("base model: ", base.status().message()));
  }
  base_ = std::make_unique<engine::BaseModel>(*std::move(base));
  if (absl::Status status = rollout::ValidateSampling(spec_.sampling(), base_->config().vocab_size);
      !status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.", status.message(), " (the base model's vocabulary)"));
  }
  auto architecture = engine::hf::BaseModelArchitecture(spec_.base_model_path());
  if (!architecture.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("base model: ", architecture.status().message()));
  }
  base_architecture_ = *std::move(architecture);
  auto codec = engine::text::TextCodecFor(spec_.base_model_path());
  if (!codec.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("tokenizer: ", codec.status().message()));
  }
  codec_ = *std::move(codec);
  auto task = MakeJobTask(spec_, *codec_);
  if (!task.ok()) return task.status();
  task_ = *std::move(task);
  GrpcServiceDialer grpc_dialer(environment_.auth_token, environment_.tls);
  ServiceDialer& dialer = environment_.dialer != nullptr ? *environment_.dialer : grpc_dialer;
  auto replicas = RolloutReplicas(spec_.endpoints());
  if (!replicas.ok()) return replicas.status();
  rollout_addresses_ = *std::move(replicas);
  if (!spec_.endpoints().rollout_service().empty()) {
    spdlog::info("job {}: rollout replicas of {}: {}", job_.id(),
                 spec_.endpoints().rollout_service(), absl::StrJoin(rollout_addresses_, ", "));
  }
  for (const std::string& address : rollout_addresses_) {
    auto stub = dialer.Rollout(address);
    if (!stub.ok()) return stub.status();
    rollouts_.push_back(*std::move(stub));
  }
  auto weight_store = dialer.WeightStore(spec_.endpoints().weight_store());
  if (!weight_store.ok()) return weight_store.status();
  weight_store_ = *std::move(weight_store);
  if (!spec_.endpoints().router_replay().empty()) {
    auto router_replay = dialer.RouterReplay(spec_.endpoints().router_replay());
    if (!router_replay.ok()) return router_replay.status();
    router_replay_ = *std::move(router_replay);
  }
  auto checkpoint = StartingCheckpoint();
  if (!checkpoint.ok()) return checkpoint.status();
  if (checkpoint->has_value()) {
    lora_ = std::make_unique<engine::LoraAdapter>(std::move((*checkpoint)->lora));
  } else {
    auto lora = InitialAdapter();
    if (!lora.ok()) return lora.status();
    lora_ = std::make_unique<engine::LoraAdapter>(*std::move(lora));
  }
  lora_->parameters().EnableGradients();
  const engine::AdamWConfig adamw{.weight_decay =
                                      static_cast<float>(spec_.algorithm_config().weight_decay())};
  auto optimizer = engine::AdamW::Create(adamw, engine::OptimizerParams(lora_->parameters()));
  if (!optimizer.ok()) return optimizer.status();
  optimizer_.emplace(*std::move(optimizer));
  if (spec_.algorithm() == v1::ALGORITHM_PPO) {
    value_head_.emplace(base_->config().d_model);
    auto critic_optimizer = engine::AdamW::Create(adamw, value_head_->OptimizerParams());
    if (!critic_optimizer.ok()) return critic_optimizer.status();
    critic_optimizer_.emplace(*std::move(critic_optimizer));
  }
  if (!checkpoint->has_value()) return absl::OkStatus();
  // A job resuming needs its value head back; one initialized from a checkpoint without one (a
  // GRPO job's) trains a fresh head.
  const bool resuming = start_step_ > 0;
  if (value_head_ && (resuming || (*checkpoint)->critic.has_value())) {
    if (absl::Status status = RestoreCritic((*checkpoint)->critic); !status.ok()) return status;
  }
  return optimizer_->ImportState((*checkpoint)->optimizer);
}

absl::StatusOr<std::optional<Checkpoint>> JobRun::StartingCheckpoint() {
  const std::string& output_dir = spec_.output_dir();
  auto found = LoadCheckpoint(output_dir, base_->config());
  if (!found.ok()) return found.status();
  const std::string& initial_dir = spec_.initial_checkpoint_dir();
  if (found->has_value()) {
    const CheckpointOwner& writer = (*found)->owner;
    // A checkpoint naming no job predates owner records: only a job created before them can
    // find one in its output_dir without starting from it (CreateJob refuses such a directory
    // now), so it is that job's own.
    if (writer.job_id.empty() && initial_dir != output_dir) {
      spdlog::warn("job {}: the checkpoint in {} names no job (an older trainer's); resuming it",
                   job_.id(), output_dir);
      start_step_ = (*found)->step;
      return found;
    }
    if (writer.job_id == job_.id()) {
      if (writer.spec_fingerprint != owner_.spec_fingerprint) {
        return absl::FailedPreconditionError(absl::StrCat(
            "output_dir ", output_dir, " holds this job's checkpoint of step ", (*found)->step,
            " written under another spec (fingerprint ", writer.spec_fingerprint, ", now ",
            owner_.spec_fingerprint, "); not resuming it"));
      }
      start_step_ = (*found)->step;
      owner_.initialized_from = writer.initialized_from;
      return found;
    }
    if (initial_dir != output_dir) {
      return absl::FailedPreconditionError(
          absl::StrCat("output_dir ", output_dir, " holds the checkpoint of job ", writer.job_id,
                       " (step ", (*found)->step,
                       "), not this job's: a job resumes only its own checkpoint; to start "
                       "from that one, name it in initial_checkpoint_dir"));
    }
  }
  if (initial_dir.empty()) return std::nullopt;
  if (initial_dir != output_dir) {
    found = LoadCheckpoint(initial_dir, base_->config());
    if (!found.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("initial_checkpoint_dir: ", found.status().message()));
    }
  }
  if (!found->has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("initial_checkpoint_dir ", initial_dir, " holds no checkpoint"));
  }
  auto lora_config = weight_store::LoraConfigFromProto(spec_.lora());
  if (!lora_config.ok()) return lora_config.status();
  if (!SameLora((*found)->lora.config(), *lora_config)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "initial_checkpoint_dir ", initial_dir, " holds an adapter of ",
        (*found)->lora.config().ToJson(), "; the spec's lora is ", lora_config->ToJson()));
  }
  const std::string& source = (*found)->owner.job_id;
  owner_.initialized_from = source.empty() ? initial_dir : source;
  spdlog::info("job {} starts from the checkpoint in {} (job {}, step {})", job_.id(), initial_dir,
               owner_.initialized_from, (*found)->step);
  return found;
}

absl::Status JobRun::RestoreCritic(const std::optional<CriticState>& critic) {
  if (!critic.has_value()) {
    return absl::DataLossError("checkpoint of a PPO job holds no value head");
  }
  absl::Status status = value_head_->Restore(critic->head);
  if (status.ok()) status = critic_optimizer_->ImportState(critic->optimizer);
  if (status.ok()) return status;
  return absl::DataLossError(absl::StrCat("checkpoint of a PPO job: ", status.message()));
}

absl::StatusOr<engine::LoraAdapter> JobRun::InitialAdapter() const {
  auto lora_config = weight_store::LoraConfigFromProto(spec_.lora());
  if (!lora_config.ok()) return lora_config.status();
  const std::string& path = spec_.initial_adapter_path();
  if (path.empty()) return engine::LoraAdapter::Create(base_->config(), *lora_config, spec_.seed());
  auto adapter =
      engine::ReadPeftAdapter(path, base_->config(), engine::ModuleNamesOf(base_architecture_));
  if (!adapter.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("initial adapter: ", adapter.status().message()));
  }
  if (!SameLora(adapter->config(), *lora_config)) {
    return absl::FailedPreconditionError(
        absl::StrCat("initial adapter '", path, "' is ", adapter->config().ToJson(),
                     "; the spec's lora is ", lora_config->ToJson()));
  }
  return adapter;
}

absl::StatusOr<int64_t> JobRun::NewestVersion() {
  v1::GetManifestRequest request;
  request.mutable_adapter()->set_adapter_name(spec_.adapter_name());
  request.mutable_adapter()->set_latest(true);
  v1::GetManifestResponse response;
  grpc::ClientContext context;
  SetDeadline(context);
  const absl::Status status =
      FromGrpcStatus(weight_store_->GetManifest(&context, request, &response));
  if (absl::IsNotFound(status)) return 0;
  if (!status.ok()) return status;
  return response.manifest().version();
}

absl::Status JobRun::RideOutOutage(absl::string_view store,
                                   const std::function<absl::Status(int attempt)>& call) {
  const absl::Time start = absl::Now();
  absl::Duration backoff = std::min(environment_.retry_backoff, kMaxStoreBackoff);
  for (int attempt = 0;; ++attempt) {
    if (*cancelled_) return Cancelled();
    absl::Status status = call(attempt);
    // UNAVAILABLE: restarting or unreachable; RESOURCE_EXHAUSTED: a full disk or a busy store
    // (router-replay's stream limit), both expected to pass.
    if (!absl::IsUnavailable(status) && !absl::IsResourceExhausted(status)) return status;
    const absl::Duration down = absl::Now() - start;
    if (down + backoff > environment_.store_outage_budget) {
      return absl::Status(
          status.code(),
          absl::StrCat(store, " unavailable for ",
                       absl::FormatDuration(absl::Trunc(down, absl::Seconds(1))),
                       " (outage budget ", absl::FormatDuration(environment_.store_outage_budget),
                       "): ", status.message()));
    }
    spdlog::warn("job {}: {} unavailable ({}); retrying in {}", job_.id(), store, status.message(),
                 absl::FormatDuration(backoff));
    // Sliced, so a cancel does not wait out the backoff.
    for (absl::Time until = absl::Now() + backoff; absl::Now() < until && !*cancelled_;) {
      absl::SleepFor(std::min(until - absl::Now(), kCancelCheckInterval));
    }
    backoff = std::min(backoff * 2, kMaxStoreBackoff);
  }
}

absl::Status JobRun::Publish(int64_t version, int64_t step) {
  auto published =
      weight_store::BuildAdapterVersion(*lora_, base_->config(), spec_.adapter_name(), version);
  if (!published.ok()) return published.status();
  (*published->manifest.mutable_labels())["job_id"] = job_.id();
  (*published->manifest.mutable_labels())["step"] = absl::StrCat(step);
  if (!base_architecture_.empty()) {
    (*published->manifest.mutable_labels())[weight_store::kArchitectureLabel] = base_architecture_;
  }
  return RideOutOutage("weight-store", [&](int attempt) {
    const absl::Status status =
        weight_store::PublishAdapter(*weight_store_, published->manifest, published->shard_views(),
                                     {.ucx = environment_.ucx})
            .status();
    // A retry after an outage finds the version committed when the first try's commit landed
    // just before the store went away: this trainer is its only producer, so it is ours.
    return attempt > 0 && absl::IsAlreadyExists(status) ? absl::OkStatus() : status;
  });
}

absl::Status JobRun::AwaitSwap(int64_t version) {
  const absl::Time deadline = absl::Now() + environment_.swap_timeout;
  for (size_t r = 0; r < rollouts_.size(); ++r) {
    absl::Duration poll = environment_.swap_poll_initial;
    while (true) {
      v1::GetAdapterStatusRequest request;
      request.set_adapter_name(spec_.adapter_name());
      v1::GetAdapterStatusResponse response;
      grpc::ClientContext context;
      SetTimeout(context, absl::Seconds(10));
      const absl::Status status =
          FromGrpcStatus(rollouts_[r]->GetAdapterStatus(&context, request, &response));
      // A replica that does not follow the adapter yet (or is restarting, and so will not
      // either) loads the version on first use.
      if (absl::IsNotFound(status) || absl::IsUnavailable(status)) break;
      if (!status.ok()) return status;
      if (response.adapters(0).current_version() >= version) break;
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("rollout ", rollout_addresses_[r], " did not serve version ", version,
                         " within ", absl::FormatDuration(environment_.swap_timeout),
                         "; last error: ", response.adapters(0).last_error()));
      }
      absl::SleepFor(poll);
      poll = std::min(poll * 2, environment_.swap_poll_max);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::GenerateResponse>> JobRun::GenerateOn(
    v1::RolloutService::StubInterface& stub, const v1::GenerateRequest& request) {
  grpc::ClientContext context;
  SetDeadline(context);
  {
    absl::MutexLock lock(&calls_mutex_);
    if (abandoned_) return absl::CancelledError("generation abandoned");
    calls_.insert(&context);
  }
  auto reader = stub.Generate(&context, request);
  std::vector<v1::GenerateResponse> responses;
  v1::GenerateResponse response;
  while (reader->Read(&response)) responses.push_back(response);
  const absl::Status status = FromGrpcStatus(reader->Finish());
  {
    absl::MutexLock lock(&calls_mutex_);
    calls_.erase(&context);
  }
  if (!status.ok()) return status;
  return responses;
}

void JobRun::AbandonGeneration() {
  absl::MutexLock lock(&calls_mutex_);
  abandoned_ = true;
  for (grpc::ClientContext* context : calls_) context->TryCancel();
}

absl::StatusOr<std::vector<v1::GenerateResponse>> JobRun::RequestSamples(
    int64_t step, int64_t version, int attempt, const std::vector<std::vector<int>>& prompt_ids) {
  const int prompts = static_cast<int>(prompt_ids.size()), group = spec_.group_size();
  // Contiguous shares of the prompts, one per replica, each sent as requests of at most the
  // rollout's limit; all in flight together.
  struct Chunk {
    int replica, first, end;
  };
  std::vector<Chunk> chunks;
  const int replicas = static_cast<int>(rollouts_.size());
  for (int r = 0; r < replicas; ++r) {
    const int share_end = static_cast<int>(int64_t{prompts} * (r + 1) / replicas);
    for (int first = static_cast<int>(int64_t{prompts} * r / replicas); first < share_end;
         first += rollout::kMaxPromptsPerRequest) {
      chunks.push_back({r, first, std::min(share_end, first + rollout::kMaxPromptsPerRequest)});
    }
  }
  std::vector<absl::StatusOr<std::vector<v1::GenerateResponse>>> results(chunks.size());
  std::vector<std::thread> threads;
  for (size_t c = 0; c < chunks.size(); ++c) {
    v1::GenerateRequest request =
        GenerateRequestFor(step, version, attempt, chunks[c].first, chunks[c].end, prompt_ids);
    request.set_request_id(absl::StrCat(job_.id(), "-s", step, "-v", version, "-r",
                                        chunks[c].replica, "-c", c, "-a", attempt));
    threads.emplace_back(
        [this, &results, c, stub = rollouts_[chunks[c].replica].get(),
         request = std::move(request)] { results[c] = GenerateOn(*stub, request); });
  }
  for (std::thread& thread : threads) thread.join();

  std::vector<v1::GenerateResponse> responses(static_cast<size_t>(prompts) * group);
  for (size_t c = 0; c < chunks.size(); ++c) {
    const std::string& address = rollout_addresses_[chunks[c].replica];
    if (!results[c].ok()) {
      return absl::Status(results[c].status().code(),
                          absl::StrCat("rollout ", address, ": ", results[c].status().message()));
    }
    for (v1::GenerateResponse& response : *results[c]) {
      if (response.finish_reason() == v1::FINISH_REASON_ERROR) {
        return absl::InternalError(
            absl::StrCat("rollout sample failed: ", response.error_message()));
      }
      if (response.finish_reason() == v1::FINISH_REASON_CANCELLED) {  // Retried elsewhere/later.
        return absl::UnavailableError(absl::StrCat("rollout ", address, " is draining"));
      }
      const int prompt = chunks[c].first + response.prompt_index();
      responses[static_cast<size_t>(prompt) * group + response.sample_index()] =
          std::move(response);
    }
  }
  return responses;
}

v1::GenerateRequest JobRun::GenerateRequestFor(int64_t step, int64_t version, int attempt,
                                               int first, int end,
                                               const std::vector<std::vector<int>>& prompt_ids) {
  v1::GenerateRequest request;
  for (int p = first; p < end; ++p) {
    v1::Prompt& prompt = *request.add_prompts();
    prompt.mutable_token_ids()->mutable_ids()->Add(prompt_ids[p].begin(), prompt_ids[p].end());
    prompt.set_prompt_id(absl::StrCat("s", step, ".p", p));
  }
  request.set_group_size(spec_.group_size());
  *request.mutable_sampling() = spec_.sampling();
  request.mutable_sampling()->set_seed(engine::MixSeed(spec_.seed(), step));
  request.mutable_adapter()->set_adapter_name(spec_.adapter_name());
  request.mutable_adapter()->set_exact_version(version);
  request.set_allow_version_switch(spec_.partial_rollouts());
  if (router_replay_ != nullptr) {
    request.mutable_routes()->set_enabled(true);
    request.mutable_routes()->set_job_id(job_.id());
    request.mutable_routes()->set_attempt(attempt);  // A retry never overwrites routes.
  }
  return request;
}

absl::StatusOr<StepSamples> JobRun::Generate(int64_t step, int64_t version) {
  const int group = spec_.group_size();
  const std::vector<engine::Sample> problems = engine::GeneratePrompts(
      *task_, spec_.prompts_per_step(), engine::MixSeed(spec_.seed(), step));
  std::vector<std::vector<int>> prompts;
  for (const engine::Sample& problem : problems) {
    auto ids = codec_->EncodePrompt(problem.prompt);
    if (!ids.ok()) return ids.status();
    prompts.push_back(*std::move(ids));
  }
  // A replica that restarts or is briefly unreachable costs a retry of the step's generation,
  // not the job.
  absl::StatusOr<std::vector<v1::GenerateResponse>> responses;
  absl::Duration backoff = environment_.retry_backoff;
  for (int attempt = 0;; ++attempt) {
    responses = RequestSamples(step, version, attempt, prompts);
    if (responses.ok() || !absl::IsUnavailable(responses.status()) ||
        attempt + 1 >= environment_.generate_attempts || Abandoned()) {
      break;
    }
    spdlog::warn("job {} step {}: {}; retrying in {}", job_.id(), step,
                 responses.status().ToString(), absl::FormatDuration(backoff));
    absl::SleepFor(backoff);
    backoff *= 2;
  }
  if (!responses.ok()) return responses.status();
  StepSamples samples;
  samples.responses = *std::move(responses);
  for (size_t i = 0; i < samples.responses.size(); ++i) {
    const v1::GenerateResponse& response = samples.responses[i];
    const engine::Sample& problem = problems[i / group];
    TrainingSample& sample = samples.training.emplace_back();
    sample.prompt = prompts[i / group];
    sample.response.assign(response.token_ids().begin(), response.token_ids().end());
    sample.rollout_logprobs.assign(response.logprobs().begin(), response.logprobs().end());
    sample.group = static_cast<int>(i / group);
    sample.reward = task_->Reward(problem.prompt, codec_->DecodeCompletion(sample.response));
    sample.truncated = response.finish_reason() == v1::FINISH_REASON_LENGTH;
    samples.accuracy += sample.reward >= 1;
    samples.reward_mean += sample.reward;
    samples.length_mean += static_cast<double>(sample.response.size());
    samples.truncated_share += sample.truncated;
    const auto& versions = response.token_adapter_versions();
    samples.partial_share += !versions.empty() && versions[versions.size() - 1] > versions[0];
  }
  const double count = static_cast<double>(samples.training.size());
  samples.accuracy /= count;
  samples.reward_mean /= count;
  samples.length_mean /= count;
  samples.truncated_share /= count;
  samples.partial_share /= count;
  return samples;
}

absl::StatusOr<std::vector<int16_t>> JobRun::FetchRoutes(const StepSamples& samples,
                                                         double* missing_share) {
  std::vector<router_replay::ReplaySequence> sequences;
  int64_t rows = 0;
  for (const v1::GenerateResponse& response : samples.responses) {
    const v1::RouteRecordKey& key = response.route_key();
    const int64_t tokens = response.prompt_tokens() + response.token_ids_size();
    sequences.push_back(
        {{key.job_id(), key.policy_version(), key.sample_id(), key.attempt()}, tokens});
    rows += tokens - 1;
  }
  const engine::ModelConfig& model = base_->config();
  // allow_partial: a record missing, unsealed or deleted during the fetch comes back as -1
  // rows, routed live and counted in missing_route_share, instead of failing the step.
  auto fetched = router_replay::FetchReplayRoutes(*router_replay_, sequences,
                                                  {.moe_layers = model.MoeLayerIndices(),
                                                   .top_k = model.top_k,
                                                   .num_experts = model.num_experts,
                                                   .allow_partial = true,
                                                   .timeout = environment_.rpc_timeout});
  if (!fetched.ok()) return fetched.status();
  *missing_share = rows > 0 ? static_cast<double>(fetched->missing_entries) /
                                  (static_cast<double>(rows) * model.num_moe_layers())
                            : 0;
  return std::move(fetched->routes);
}

absl::Status JobRun::Run(const JobProgress& progress, const std::atomic<bool>& cancelled) {
  cancelled_ = &cancelled;
  progress.on_attempt_start(start_step_);
  PolicyUpdateConfig update_config = UpdateConfigOf(spec_);
  if (value_head_) {
    update_config.critic.head = &*value_head_;
    update_config.critic.optimizer = &*critic_optimizer_;
  }
  absl::StatusOr<engine::TrainingEngines> engines =
      engine::MakeTrainingEngines(environment_.device, *base_, *lora_);
  if (!engines.ok()) return engines.status();
  PolicyUpdater updater(*base_, *lora_, *optimizer_, std::move(update_config), *std::move(engines));
  absl::StatusOr<int64_t> newest;
  if (absl::Status status = RideOutOutage("weight-store",
                                          [&](int) {
                                            newest = NewestVersion();
                                            return newest.status();
                                          });
      !status.ok()) {
    return status;
  }
  if (!newest.ok()) return newest.status();
  // The adapter this run starts from (fresh, or restored) becomes a new version: a resumed job
  // never assumes that versions published after its checkpoint match its weights.
  int64_t version = *newest + 1;
  if (absl::Status status = Publish(version, start_step_); !status.ok()) return status;
  progress.on_published(version);
  // ASYNC: generation runs up to max_staleness steps ahead of training, each step's samples
  // generated with the newest version published when its generation starts, so a step trains
  // on samples at most max_staleness versions behind; mismatch weights correct for it.
  const int64_t lookahead = spec_.sync_mode() == v1::SYNC_MODE_ASYNC ? spec_.max_staleness() : 0;
  struct Ahead {
    int64_t step;
    int64_t version;
    std::future<absl::StatusOr<StepSamples>> samples;
  };
  std::deque<Ahead> ahead;  // Ascending steps.
  // Leaving early (cancel, error) must not wait out generations nobody will use.
  const absl::Cleanup stop_ahead = [&] {
    if (ahead.empty()) return;
    AbandonGeneration();
    for (Ahead& pending : ahead) pending.samples.wait();
  };
  for (int64_t step = start_step_ + 1; step <= spec_.num_steps(); ++step) {
    if (cancelled) return Cancelled();
    v1::StepMetrics metrics;
    metrics.set_step(step);
    const absl::Time step_start = absl::Now();
    int64_t rollout_version = version;
    absl::StatusOr<StepSamples> samples;
    if (!ahead.empty() && ahead.front().step == step) {
      rollout_version = ahead.front().version;
      samples = ahead.front().samples.get();
      ahead.pop_front();
    } else {
      samples = Generate(step, version);
    }
    if (!samples.ok()) return samples.status();
    metrics.set_min_rollout_version(rollout_version);
    metrics.set_generation_seconds(SecondsSince(step_start));
    for (int64_t next = ahead.empty() ? step + 1 : ahead.back().step + 1;
         next <= std::min(step + lookahead, spec_.num_steps()); ++next) {
      // Held until the step takes the samples: publishing ahead must not retire the version
      // under a retry of this generation.
      std::shared_ptr<VersionPin> pin =
          VersionPin::Take(*weight_store_, spec_.adapter_name(), version,
                           absl::StrCat("trainer/", job_.id()), environment_.rpc_timeout);
      ahead.push_back({next, version,
                       std::async(std::launch::async,
                                  [this, next, v = version, pin] { return Generate(next, v); })});
    }
    if (cancelled) return Cancelled();

    std::vector<int16_t> routes;
    double missing_share = 0;
    if (router_replay_ != nullptr) {
      const absl::Time start = absl::Now();
      absl::StatusOr<std::vector<int16_t>> fetched;
      if (absl::Status status = RideOutOutage("router-replay",
                                              [&](int) {
                                                fetched = FetchRoutes(*samples, &missing_share);
                                                return fetched.status();
                                              });
          !status.ok()) {
        return status;
      }
      if (!fetched.ok()) return fetched.status();
      routes = *std::move(fetched);
      metrics.set_route_fetch_seconds(SecondsSince(start));
    }

    absl::Time start = absl::Now();
    absl::StatusOr<UpdateStats> stats = updater.Update(samples->training, routes);
    if (!stats.ok()) return stats.status();
    if (absl::Status status = CheckFinite(step, *stats, *lora_); !status.ok()) return status;
    metrics.set_training_seconds(SecondsSince(start));
    if (cancelled) return Cancelled();

    start = absl::Now();
    ++version;
    if (absl::Status status = Publish(version, step); !status.ok()) return status;
    metrics.set_publish_seconds(SecondsSince(start));
    progress.on_published(version);
    start = absl::Now();
    if (absl::Status status = AwaitSwap(version); !status.ok()) return status;
    metrics.set_swap_seconds(SecondsSince(start));

    if ((spec_.checkpoint_every() > 0 && step % spec_.checkpoint_every() == 0) ||
        step == spec_.num_steps()) {
      std::optional<CriticState> critic;
      if (value_head_)
        critic = CriticState{value_head_->Tensors(), critic_optimizer_->ExportState()};
      if (absl::Status status =
              SaveCheckpoint(spec_.output_dir(), owner_, step, version, *lora_,
                             optimizer_->ExportState(), critic ? &*critic : nullptr);
          !status.ok()) {
        return status;
      }
    }
    metrics.set_policy_version(version);
    metrics.set_reward_mean(samples->reward_mean);
    metrics.set_accuracy(samples->accuracy);
    metrics.set_response_length_mean(samples->length_mean);
    metrics.set_truncated_share(samples->truncated_share);
    metrics.set_partial_rollout_share(samples->partial_share);
    metrics.set_routing_disagreement_token_layer(stats->routing.decision_disagreement());
    metrics.set_routing_disagreement_token(stats->routing.token_disagreement());
    metrics.set_missing_route_share(missing_share);
    metrics.set_mismatch_kl_k3(stats->mismatch_kl_k3);
    metrics.set_large_mismatch_share(stats->large_mismatch_share);
    metrics.set_is_weight_ess(stats->is_ess);
    metrics.set_is_clipped_share(stats->is_clipped_share);
    metrics.set_ppo_clip_share(stats->ppo_clip_share);
    metrics.set_ref_kl(stats->ref_kl);
    metrics.set_loss(stats->loss);
    metrics.set_value_loss(stats->value_loss);
    metrics.set_explained_variance(stats->explained_variance);
    metrics.set_grad_norm(stats->grad_norm);
    metrics.set_learning_rate(stats->learning_rate);
    metrics.set_response_tokens(stats->response_tokens);
    metrics.set_step_seconds(SecondsSince(step_start));
    progress.on_step(metrics);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<v1::RolloutService::StubInterface>> GrpcServiceDialer::Rollout(
    const std::string& address) {
  return Dial<v1::RolloutService>(address, "tandem.v1.RolloutService", auth_token_, tls_);
}

absl::StatusOr<std::unique_ptr<v1::WeightStoreService::StubInterface>>
GrpcServiceDialer::WeightStore(const std::string& address) {
  return Dial<v1::WeightStoreService>(address, "tandem.v1.WeightStoreService", auth_token_, tls_);
}

absl::StatusOr<std::unique_ptr<v1::RouterReplayService::StubInterface>>
GrpcServiceDialer::RouterReplay(const std::string& address) {
  return Dial<v1::RouterReplayService>(address, "tandem.v1.RouterReplayService", auth_token_, tls_);
}

absl::Status RunJob(const v1::Job& job, const JobEnvironment& environment,
                    const JobProgress& progress, const std::atomic<bool>& cancelled) {
  JobRun run(job, environment);
  if (absl::Status status = run.Init(); !status.ok()) return status;
  return run.Run(progress, cancelled);
}

}  // namespace tandem::trainer
