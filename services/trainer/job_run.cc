#include "services/trainer/job_run.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/channel.h"
#include "common/clock.h"
#include "common/counting_communicator.h"
#include "common/logging.h"
#include "common/status.h"
#include "engine/cuda/device_engines.h"
#include "engine/hf/hf_model.h"
#include "engine/module_names.h"
#include "engine/peft_adapter.h"
#include "engine/sampler.h"
#include "engine/tasks.h"
#include "engine/text/text_codec.h"
#include "services/rollout/client/sample_fan_out.h"
#include "services/rollout/client/sampling_rules.h"
#include "services/rollout/client/version_swap.h"
#include "services/router_replay/client/route_source.h"
#include "services/trainer/checkpoint.h"
#include "services/trainer/data_parallel_share.h"
#include "services/trainer/job_spec.h"
#include "services/trainer/local_rendezvous_store.h"
#include "services/trainer/policy_update.h"
#include "services/trainer/rank_agreement.h"
#include "services/trainer/service_endpoints.h"
#include "services/trainer/sharded_publish.h"
#include "services/trainer/starting_point.h"
#include "services/trainer/step_metrics.h"
#include "services/trainer/step_routes.h"
#include "services/trainer/step_sampler.h"
#include "services/trainer/store_outage.h"
#include "services/trainer/task_source.h"
#include "services/trainer/version_pin.h"
#include "services/weight_store/client/adapter_client.h"
#include "services/weight_store/client/engine_lora.h"
#include "tandem/rollout/v1/rollout.grpc.pb.h"
#include "tandem/routerreplay/v1/router_replay.grpc.pb.h"
#include "tandem/weightstore/v1/weight_store.grpc.pb.h"

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

double SecondsSince(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

absl::Status Cancelled() { return absl::CancelledError("job cancelled"); }

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

engine::ScheduleConfig ScheduleOf(const trainer::v1::JobSpec& spec) {
  const trainer::v1::AlgorithmConfig& algorithm = spec.algorithm_config();
  const trainer::v1::LearningRateSchedule& schedule = algorithm.lr_schedule();
  const auto peak = static_cast<float>(algorithm.learning_rate());
  return {.peak_lr = peak,
          .min_lr = static_cast<float>(peak * schedule.min_lr_ratio()),
          .warmup_steps = schedule.warmup_updates(),
          .total_steps = std::max<int64_t>(1, spec.num_steps() * algorithm.updates_per_step()),
          .decay = schedule.decay() == trainer::v1::LR_DECAY_LINEAR   ? engine::LrDecay::kLinear
                   : schedule.decay() == trainer::v1::LR_DECAY_COSINE ? engine::LrDecay::kCosine
                                                                      : engine::LrDecay::kConstant};
}

PolicyUpdateConfig UpdateConfigOf(const trainer::v1::JobSpec& spec) {
  const trainer::v1::AlgorithmConfig& algorithm = spec.algorithm_config();
  const trainer::v1::IsCorrection& correction = spec.is_correction();
  PolicyUpdateConfig config;
  config.baseline = spec.algorithm() == trainer::v1::ALGORITHM_DR_GRPO ? GroupBaseline::kDrGrpo
                                                                       : GroupBaseline::kGrpo;
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
      .aggregation =
          algorithm.loss_aggregation() == trainer::v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_SUM
              ? Aggregation::kSeqMeanTokenSum
          : algorithm.loss_aggregation() == trainer::v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_MEAN
              ? Aggregation::kSeqMeanTokenMean
              : Aggregation::kTokenMean,
      .kl_coef = algorithm.kl_coef(),
      .kl_estimator = algorithm.kl_estimator() == trainer::v1::KL_ESTIMATOR_K1 ? KlEstimator::kK1
                      : algorithm.kl_estimator() == trainer::v1::KL_ESTIMATOR_K2
                          ? KlEstimator::kK2
                          : KlEstimator::kK3};
  switch (correction.mode()) {
    case trainer::v1::IS_CORRECTION_MODE_TOKEN_TIS:
      config.is.mode = IsMode::kTokenTis;
      break;
    case trainer::v1::IS_CORRECTION_MODE_SEQUENCE_TIS:
      config.is.mode = IsMode::kSequenceTis;
      break;
    case trainer::v1::IS_CORRECTION_MODE_ICEPOP:
      config.is.mode = IsMode::kIcePop;
      break;
    case trainer::v1::IS_CORRECTION_MODE_REJECTION:
      config.is.mode = IsMode::kRejection;
      break;
    default:
      config.is.mode = IsMode::kNone;
  }
  config.is.upper = correction.upper_bound();
  config.is.lower = correction.lower_bound();
  config.is.level = correction.rejection_level() == trainer::v1::REJECTION_LEVEL_SEQUENCE
                        ? RejectionLevel::kSequence
                        : RejectionLevel::kToken;
  config.replay = spec.routing_replay() == trainer::v1::ROUTING_REPLAY_MODE_OFF  ? RouteReplay::kOff
                  : spec.routing_replay() == trainer::v1::ROUTING_REPLAY_MODE_R2 ? RouteReplay::kR2
                                                                                 : RouteReplay::kR3;
  config.updates_per_step = algorithm.updates_per_step();
  config.micro_batch_size = spec.micro_batch_size();
  config.schedule = ScheduleOf(spec);
  config.max_grad_norm = static_cast<float>(algorithm.max_grad_norm());
  const float temperature = spec.sampling().has_temperature() ? spec.sampling().temperature() : 1;
  config.temperature = temperature > 0 ? temperature : 1;
  return config;
}

// JobProgress::on_status is optional.
void SayStatus(const JobProgress& progress, const std::string& status) {
  if (progress.on_status) progress.on_status(status);
}

class JobRun {
 public:
  // Rank 0 of the job (of one rank, or leading several) when `assignment` is null; else the
  // rank it names, joining rank 0's group through `store`.
  // rank it names, joining rank 0's group through `store`. `retry` numbers rank 0's runs of one
  // attempt after groups that broke (each forms a group of its own).
  JobRun(const trainer::v1::Job& job, const JobEnvironment& environment,
         const internal::v1::GetAssignmentResponse* assignment = nullptr,
         gloo::rendezvous::Store* store = nullptr, int retry = 0)
      : job_(job),
        retry_(retry),
        spec_(job.spec()),
        environment_(environment),
        assignment_(assignment),
        member_store_(store),
        dp_rank_(assignment != nullptr ? assignment->data_parallel_rank() : 0),
        dp_size_(std::max(1, job.spec().parallelism().data_parallel())),
        owner_{.job_id = job.id(), .spec_fingerprint = SpecFingerprint(job.spec())} {}
  ~JobRun();

  absl::Status Init();
  absl::Status Run(const JobProgress& progress, const std::atomic<bool>& cancelled);

  // Rank 0: it forms the group, owns checkpoints and reports progress.
  bool lead() const { return assignment_ == nullptr; }

 private:
  // Cancels the Generate calls in flight and any later attempt (the run is ending).
  void AbandonGeneration() { fan_out_.Abandon(); }
  bool Abandoned() { return fan_out_.abandoned(); }

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
  // The version the run publishes first: the weight-store's newest + 1 (rank 0's, for all ranks).
  absl::StatusOr<int64_t> FirstVersion();
  // A run of several ranks: forms their Gloo group (rank 0 posts the job and waits for the
  // others to join) and sends every rank rank 0's starting state.
  absl::Status JoinRanks(int64_t first_version, const JobProgress& progress);
  absl::Status FormGroupAsLead(int64_t first_version, const JobProgress& progress);
  // LoRA, optimizer and (PPO) critic state <- rank 0's.
  absl::Status BroadcastState();
  // Between phases of a step with several ranks: every rank learns whether any failed `what`.
  absl::Status Agree(const absl::Status& local, absl::string_view what) {
    return ranks_ == nullptr ? local
                             : AgreeOnFailures(*ranks_, local, what, environment_.phase_timeout);
  }
  // This rank's tallies of a step (kTallies values), every rank's when there are several.
  absl::StatusOr<std::vector<float>> GatherTallies(const StepSamples& samples,
                                                   int64_t missing_route_entries,
                                                   int64_t route_entries);
  // trainer::RideOutOutage with the environment's backoff and outage budget.
  absl::Status RideOutOutage(absl::string_view store,
                             const std::function<absl::Status(int attempt)>& call);
  absl::Status Publish(int64_t version, int64_t step);
  absl::Status AwaitSwap(int64_t version);

  const trainer::v1::Job job_;
  const int retry_;
  const trainer::v1::JobSpec& spec_;
  const JobEnvironment environment_;
  const internal::v1::GetAssignmentResponse* const assignment_;  // Null on rank 0.
  gloo::rendezvous::Store* const member_store_;        // Rank 0's values, for a rank > 0.
  const int dp_rank_;
  const int dp_size_;
  std::vector<int> own_groups_;                  // The step's prompt groups this rank generates.
  std::string group_;                            // Rank 0 of several: the run's posted group.
  std::unique_ptr<CountingCommunicator> ranks_;  // The job's ranks; null for one.
  std::unique_ptr<engine::BaseModel> base_;
  std::string base_architecture_;  // config.json's, "" for an engine file; names PEFT modules.
  std::unique_ptr<engine::text::TextCodec> codec_;  // As rollout's: prompts sent as their ids.
  std::unique_ptr<engine::Task> task_;
  std::unique_ptr<engine::LoraAdapter> lora_;
  std::optional<engine::AdamW> optimizer_;
  std::optional<ValueHead> value_head_;  // PPO's critic, with an optimizer of its own.
  std::optional<engine::AdamW> critic_optimizer_;
  std::vector<std::string> rollout_addresses_;  // One per replica, as rollouts_.
  std::vector<std::unique_ptr<rollout::v1::RolloutService::StubInterface>> rollouts_;
  std::vector<rollout::ReplicaStub> replicas_;  // rollouts_ by address.
  std::unique_ptr<weight_store::WeightStoreStubs> weight_store_;
  std::unique_ptr<routerreplay::v1::RouterReplayService::StubInterface> router_replay_;
  std::unique_ptr<router_replay::RouteSource> route_source_;  // Over router_replay_.
  int64_t start_step_ = 0;
  CheckpointOwner owner_;                         // What the run's checkpoints record.
  const std::atomic<bool>* cancelled_ = nullptr;  // Set by Run.
  rollout::SampleFanOut fan_out_;  // The step's Generate calls, cancelled when the run ends.
  std::unique_ptr<StepSampler> sampler_;  // After Init.
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
  GrpcServiceDialer grpc_dialer(environment_.auth_token, environment_.auth_token_file,
                                environment_.tls);
  ServiceDialer& dialer = environment_.dialer != nullptr ? *environment_.dialer : grpc_dialer;
  const ServiceEndpoints& services = environment_.services;
  auto replicas = RolloutReplicas(services);
  if (!replicas.ok()) return replicas.status();
  rollout_addresses_ = *std::move(replicas);
  if (!services.rollout_service.empty()) {
    spdlog::info("job {}: rollout replicas of {}: {}", job_.id(), services.rollout_service,
                 absl::StrJoin(rollout_addresses_, ", "));
  }
  for (const std::string& address : rollout_addresses_) {
    auto stub = dialer.Rollout(address);
    if (!stub.ok()) return stub.status();
    rollouts_.push_back(*std::move(stub));
  }
  auto weight_store = dialer.WeightStore(services.weight_store);
  if (!weight_store.ok()) return weight_store.status();
  weight_store_ = *std::move(weight_store);
  if (!services.router_replay.empty()) {
    auto router_replay = dialer.RouterReplay(services.router_replay);
    if (!router_replay.ok()) return router_replay.status();
    router_replay_ = *std::move(router_replay);
    route_source_ = std::make_unique<router_replay::RouterReplaySource>(*router_replay_);
  } else if (spec_.routing_replay() == trainer::v1::ROUTING_REPLAY_MODE_R3) {
    // Every rank reads its own flags: one without router-replay would train without replay.
    return absl::FailedPreconditionError(
        "the job replays routes (R3), and this trainer rank has no --router_replay");
  }
  auto share = DataParallelShare(spec_.prompts_per_step(), spec_.group_size(),
                                 spec_.algorithm_config().updates_per_step(), dp_size_, dp_rank_);
  if (!share.ok()) return share.status();
  for (size_t i = 0; i < share->size(); i += spec_.group_size()) {
    own_groups_.push_back((*share)[i] / spec_.group_size());
  }
  for (size_t r = 0; r < rollouts_.size(); ++r) {
    replicas_.push_back({.address = rollout_addresses_[r], .stub = rollouts_[r].get()});
  }
  sampler_ =
      std::make_unique<StepSampler>(StepSamplerConfig{.job_id = job_.id(),
                                                      .spec = &spec_,
                                                      .own_groups = own_groups_,
                                                      .data_parallel_rank = dp_rank_,
                                                      .record_routes = router_replay_ != nullptr,
                                                      .attempts = environment_.generate_attempts,
                                                      .retry_backoff = environment_.retry_backoff,
                                                      .rpc_timeout = environment_.rpc_timeout},
                                    *task_, *codec_, replicas_, fan_out_, Clock::Real());
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
  if (dp_size_ > 1) {
    // Each rank publishes a shard of its own: refused now, not after the group formed.
    auto split = weight_store::BuildAdapterVersion(*lora_, base_->config(), spec_.adapter_name(), 1,
                                                   type::v1::DTYPE_F32, dp_size_);
    if (!split.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("spec.parallelism.data_parallel: ", split.status().message()));
    }
  }
  const engine::AdamWConfig adamw{.weight_decay =
                                      static_cast<float>(spec_.algorithm_config().weight_decay())};
  auto optimizer = engine::AdamW::Create(adamw, engine::OptimizerParams(lora_->parameters()));
  if (!optimizer.ok()) return optimizer.status();
  optimizer_.emplace(*std::move(optimizer));
  if (spec_.algorithm() == trainer::v1::ALGORITHM_PPO) {
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
  // A rank > 0 starts from rank 0's state (BroadcastState): the checkpoints are rank 0's.
  if (!lead()) {
    start_step_ = assignment_->start_step();
    return std::nullopt;
  }
  absl::StatusOr<StartingPoint> start = FindStartingPoint(spec_, owner_, base_->config());
  if (!start.ok()) return start.status();
  start_step_ = start->start_step;
  owner_.initialized_from = start->initialized_from;
  return std::move(start->checkpoint);
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
  // A rank > 0 only needs the adapter's shape: its values come from rank 0.
  if (path.empty() || !lead()) {
    return engine::LoraAdapter::Create(base_->config(), *lora_config, spec_.seed());
  }
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

JobRun::~JobRun() {
  if (group_.empty()) return;
  environment_.roster->Withdraw(group_);
  environment_.rendezvous->Withdraw(group_);
}

absl::StatusOr<int64_t> JobRun::FirstVersion() {
  if (!lead()) return assignment_->first_version();
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
  return *newest + 1;
}

absl::Status JobRun::JoinRanks(int64_t first_version, const JobProgress& progress) {
  if (lead()) {
    if (absl::Status status = FormGroupAsLead(first_version, progress); !status.ok()) {
      return status;
    }
  } else {
    auto joined = GlooCommunicator::Create(*member_store_, dp_rank_, dp_size_, environment_.gloo);
    if (!joined.ok()) return joined.status();
    ranks_ = std::make_unique<CountingCommunicator>(*std::move(joined));
  }
  spdlog::info("job {}: data-parallel rank {} of {} trains prompt groups {}", job_.id(), dp_rank_,
               dp_size_, absl::StrJoin(own_groups_, ","));
  return BroadcastState();
}

absl::Status JobRun::FormGroupAsLead(int64_t first_version, const JobProgress& progress) {
  RankRoster* roster = environment_.roster;
  if (roster == nullptr || environment_.rendezvous == nullptr || roster->ranks() < dp_size_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job asks for ", dp_size_, " data-parallel trainer ranks; this trainer deployment has ",
        roster == nullptr ? 1 : roster->ranks(), " (the trainer's --ranks)"));
  }
  internal::v1::GetAssignmentResponse assignment;
  *assignment.mutable_job() = job_;
  assignment.set_group(absl::StrCat(job_.id(), "/a", job_.attempt(), "r", retry_));
  assignment.set_start_step(start_step_);
  assignment.set_first_version(first_version);
  if (absl::Status status = roster->Post(assignment, dp_size_); !status.ok()) return status;
  group_ = assignment.group();
  if (absl::Status status = roster->AwaitJoined(
          group_, dp_size_, absl::Now() + environment_.rank_join_timeout, *cancelled_,
          [&](const std::string& waiting) { SayStatus(progress, waiting); });
      !status.ok()) {
    return status;
  }
  SayStatus(progress, "");
  // The others may still be loading the model: joining waits as long as they took to come.
  LocalRendezvousStore store(*environment_.rendezvous, group_,
                             environment_.gloo.join_timeout.value_or(environment_.gloo.timeout));
  auto formed = GlooCommunicator::Create(store, 0, dp_size_, environment_.gloo);
  if (!formed.ok()) return formed.status();
  ranks_ = std::make_unique<CountingCommunicator>(*std::move(formed));
  // Formed: a rank that restarts from now on finds nothing to join until the next run.
  roster->Withdraw(group_);
  return absl::OkStatus();
}

absl::Status JobRun::BroadcastState() {
  std::map<std::string, std::vector<float>> lora;
  for (const std::string& name : lora_->parameters().names()) {
    lora[name] = lora_->parameters().Find(name)->value;
  }
  if (absl::Status status = BroadcastTensors(*ranks_, lora); !status.ok()) return status;
  // In place: the optimizer and the engines hold the parameters' memory.
  for (const auto& [name, values] : lora) {
    std::vector<float>& held = lora_->parameters().Find(name)->value;
    std::copy(values.begin(), values.end(), held.begin());
  }
  if (absl::Status status = BroadcastOptimizerState(*ranks_, *optimizer_); !status.ok()) {
    return status;
  }
  if (!value_head_) return absl::OkStatus();
  std::map<std::string, std::vector<float>> head = value_head_->Tensors();
  if (absl::Status status = BroadcastTensors(*ranks_, head); !status.ok()) return status;
  if (absl::Status status = value_head_->Restore(head); !status.ok()) return status;
  return BroadcastOptimizerState(*ranks_, *critic_optimizer_);
}

absl::StatusOr<std::vector<float>> JobRun::GatherTallies(const StepSamples& samples,
                                                         int64_t missing_route_entries,
                                                         int64_t route_entries) {
  std::vector<float> tally = TalliesOf(samples, missing_route_entries, route_entries);
  if (ranks_ == nullptr) return tally;
  return GatherFromRanks(*ranks_, tally);
}

absl::StatusOr<int64_t> JobRun::NewestVersion() {
  weightstore::v1::GetManifestRequest request;
  request.mutable_adapter()->set_adapter_name(spec_.adapter_name());
  request.mutable_adapter()->set_latest(true);
  weightstore::v1::GetManifestResponse response;
  grpc::ClientContext context;
  SetDeadline(context);
  const absl::Status status =
      FromGrpcStatus(weight_store_->api().GetManifest(&context, request, &response));
  if (absl::IsNotFound(status)) return 0;
  if (!status.ok()) return status;
  return response.manifest().version();
}

absl::Status JobRun::RideOutOutage(absl::string_view store,
                                   const std::function<absl::Status(int attempt)>& call) {
  return trainer::RideOutOutage(
      store,
      {.initial_backoff = environment_.retry_backoff, .budget = environment_.store_outage_budget},
      *cancelled_, Clock::Real(), call);
}

absl::Status JobRun::Publish(int64_t version, int64_t step) {
  auto published = weight_store::BuildAdapterVersion(*lora_, base_->config(), spec_.adapter_name(),
                                                     version, type::v1::DTYPE_F32, dp_size_);
  if (!published.ok()) return published.status();
  (*published->manifest.mutable_labels())["job_id"] = job_.id();
  (*published->manifest.mutable_labels())["step"] = absl::StrCat(step);
  if (!base_architecture_.empty()) {
    (*published->manifest.mutable_labels())[weight_store::kArchitectureLabel] = base_architecture_;
  }
  if (ranks_ != nullptr) {
    return PublishTogether(
        *ranks_, *weight_store_, *published, {.ucx = environment_.ucx},
        [this](const std::function<absl::Status()>& call) {
          return RideOutOutage("weight-store", [&](int) { return call(); });
        },
        environment_.phase_timeout);
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
  return rollout::AwaitVersionServed(replicas_, spec_.adapter_name(), version,
                                     {.timeout = environment_.swap_timeout,
                                      .poll_initial = environment_.swap_poll_initial,
                                      .poll_max = environment_.swap_poll_max},
                                     Clock::Real());
}

absl::Status JobRun::Run(const JobProgress& progress, const std::atomic<bool>& cancelled) {
  cancelled_ = &cancelled;
  progress.on_attempt_start(start_step_);
  absl::StatusOr<int64_t> first_version = FirstVersion();
  if (!first_version.ok()) return first_version.status();
  if (dp_size_ > 1) {
    if (absl::Status status = JoinRanks(*first_version, progress); !status.ok()) return status;
  }
  PolicyUpdateConfig update_config = UpdateConfigOf(spec_);
  update_config.data_parallel = ranks_.get();
  if (value_head_) {
    update_config.critic.head = &*value_head_;
    update_config.critic.optimizer = &*critic_optimizer_;
  }
  absl::StatusOr<engine::TrainingEngines> engines =
      engine::MakeTrainingEngines(environment_.device, *base_, *lora_);
  if (!engines.ok()) return engines.status();
  PolicyUpdater updater(*base_, *lora_, *optimizer_, std::move(update_config), *std::move(engines));
  int64_t version = *first_version;
  if (absl::Status status = Publish(version, start_step_); !status.ok()) return status;
  progress.on_published(version);
  // ASYNC: generation runs up to max_staleness steps ahead of training, each step's samples
  // generated with the newest version published when its generation starts, so a step trains
  // on samples at most max_staleness versions behind; mismatch weights correct for it.
  const int64_t lookahead =
      spec_.sync_mode() == trainer::v1::SYNC_MODE_ASYNC ? spec_.max_staleness() : 0;
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
    trainer::v1::StepMetrics metrics;
    metrics.set_step(step);
    const absl::Time step_start = absl::Now();
    if (ranks_ != nullptr) ranks_->TakeCounts();  // This step's from here.
    int64_t rollout_version = version;
    absl::StatusOr<StepSamples> samples = Cancelled();
    if (cancelled) {
      // Ends the step on every rank at the agreement below.
    } else if (!ahead.empty() && ahead.front().step == step) {
      rollout_version = ahead.front().version;
      samples = ahead.front().samples.get();
      ahead.pop_front();
    } else {
      samples = sampler_->Generate(step, version);
    }
    metrics.set_min_rollout_version(rollout_version);
    metrics.set_generation_seconds(SecondsSince(step_start));
    for (int64_t next = ahead.empty() ? step + 1 : ahead.back().step + 1;
         samples.ok() && next <= std::min(step + lookahead, spec_.num_steps()); ++next) {
      // Held until the step takes the samples: publishing ahead must not retire the version
      // under a retry of this generation.
      std::shared_ptr<VersionPin> pin =
          VersionPin::Take(*weight_store_, spec_.adapter_name(), version,
                           absl::StrCat("trainer/", job_.id()), environment_.rpc_timeout);
      ahead.push_back(
          {next, version, std::async(std::launch::async, [this, next, v = version, pin] {
             return sampler_->Generate(next, v);
           })});
    }

    StepRoutes routes;
    absl::Status local = cancelled ? Cancelled() : samples.status();
    if (local.ok() && route_source_ != nullptr) {
      const absl::Time start = absl::Now();
      absl::StatusOr<StepRoutes> fetched;
      local = RideOutOutage("router-replay", [&](int) {
        fetched =
            FetchStepRoutes(*route_source_, *samples, base_->config(), environment_.rpc_timeout);
        return fetched.status();
      });
      if (local.ok()) routes = *std::move(fetched);
      metrics.set_route_fetch_seconds(SecondsSince(start));
    }
    if (absl::Status status = Agree(local, absl::StrCat("step ", step, "'s generation"));
        !status.ok()) {
      return status;
    }

    absl::Time start = absl::Now();
    absl::StatusOr<UpdateStats> stats = updater.Update(samples->training, routes.routes);
    if (!stats.ok()) return stats.status();
    // The same on every rank: statistics and gradients are the ranks' sums.
    if (absl::Status status = CheckFinite(step, *stats, *lora_); !status.ok()) return status;
    if (ranks_ != nullptr) {
      if (absl::Status status = CheckIdenticalParameters(*ranks_, lora_->parameters(), step);
          !status.ok()) {
        return status;
      }
    }
    // A cancel seen during training ends the step before anything is published.
    if (absl::Status status = Agree(cancelled ? Cancelled() : absl::OkStatus(),
                                    absl::StrCat("step ", step, " (cancelled)"));
        !status.ok()) {
      return status;
    }
    metrics.set_training_seconds(SecondsSince(start));

    start = absl::Now();
    ++version;
    if (absl::Status status = Publish(version, step); !status.ok()) return status;
    metrics.set_publish_seconds(SecondsSince(start));
    progress.on_published(version);
    start = absl::Now();
    absl::Status swapped = AwaitSwap(version);
    metrics.set_swap_seconds(SecondsSince(start));

    if (swapped.ok() && lead() &&
        ((spec_.checkpoint_every() > 0 && step % spec_.checkpoint_every() == 0) ||
         step == spec_.num_steps())) {
      std::optional<CriticState> critic;
      if (value_head_)
        critic = CriticState{value_head_->Tensors(), critic_optimizer_->ExportState()};
      swapped = SaveCheckpoint(spec_.output_dir(), owner_, step, version, *lora_,
                               optimizer_->ExportState(), critic ? &*critic : nullptr);
    }
    if (absl::Status status = Agree(swapped, absl::StrCat("step ", step, "'s swap or checkpoint"));
        !status.ok()) {
      return status;
    }
    absl::StatusOr<std::vector<float>> tallies =
        GatherTallies(*samples, routes.missing_entries, routes.entries);
    if (!tallies.ok()) return tallies.status();
    SetSampleMetrics(*tallies, metrics);
    if (ranks_ != nullptr) {
      const CountingCommunicator::Counts collectives = ranks_->TakeCounts();
      metrics.set_collective_seconds(absl::ToDoubleSeconds(collectives.time));
      metrics.set_collective_bytes(collectives.bytes);
    }
    metrics.set_policy_version(version);
    SetUpdateMetrics(*stats, metrics);
    metrics.set_step_seconds(SecondsSince(step_start));
    progress.on_step(metrics);
  }
  return absl::OkStatus();
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

absl::Status RunJob(const trainer::v1::Job& job, const JobEnvironment& environment,
                    const JobProgress& progress, const std::atomic<bool>& cancelled) {
  for (int retry = 0;; ++retry) {
    absl::Status status;
    {
      JobRun run(job, environment, /*assignment=*/nullptr, /*store=*/nullptr, retry);
      status = run.Init();
      if (status.ok()) status = run.Run(progress, cancelled);
    }  // The run's group is withdrawn before the next one is posted.
    if (status.ok() || !IsBrokenGroup(status) || retry >= environment.rank_failure_retries ||
        cancelled) {
      return status;
    }
    // A rank died or stalled: the job goes on from its last checkpoint in a new group, once
    // every rank has joined again (a restarted pod, or the same ranks after a stall).
    spdlog::warn(
        "job {}: a trainer rank failed ({}); going on from the last checkpoint (retry {} "
        "of {})",
        job.id(), status.ToString(), retry + 1, environment.rank_failure_retries);
    SayStatus(progress, absl::StrCat("a trainer rank failed (", status.message(),
                                     "); going on from the last checkpoint"));
    absl::SleepFor(environment.rank_retry_delay);
  }
}

absl::Status RunJobRank(const internal::v1::GetAssignmentResponse& assignment,
                        gloo::rendezvous::Store& store, const JobEnvironment& environment,
                        const std::atomic<bool>& cancelled) {
  JobRun run(assignment.job(), environment, &assignment, &store);
  // A rank that cannot start (no model, a bad spec) fails rank 0's group formation by its
  // absence, within rank 0's collective timeout; its own log says why.
  if (absl::Status status = run.Init(); !status.ok()) return status;
  const JobProgress rank_zeros_to_report = {.on_attempt_start = [](int64_t) {},
                                            .on_published = [](int64_t) {},
                                            .on_step = [](const trainer::v1::StepMetrics&) {},
                                            .on_status = [](const std::string&) {}};
  return run.Run(rank_zeros_to_report, cancelled);
}

}  // namespace tandem::trainer
