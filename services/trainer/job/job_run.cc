#include "services/trainer/job/job_run.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/communicator.h"
#include "common/counting_communicator.h"
#include "common/logging.h"
#include "engine/cuda/device_engines.h"
#include "engine/expert_parallel_exchange.h"
#include "engine/tasks.h"
#include "engine/text/text_codec.h"
#include "services/rollout/client/sample_fan_out.h"
#include "services/router_replay/client/route_source.h"
#include "services/trainer/api/job_spec.h"
#include "services/trainer/experts/expert_rebalance.h"
#include "services/trainer/job/checkpoint.h"
#include "services/trainer/job/generation_ahead.h"
#include "services/trainer/job/job_plan.h"
#include "services/trainer/job/starting_point.h"
#include "services/trainer/job/store_outage.h"
#include "services/trainer/job/task_source.h"
#include "services/trainer/job/training_state.h"
#include "services/trainer/job/version_pin.h"
#include "services/trainer/ranks/rank_agreement.h"
#include "services/trainer/ranks/rank_group.h"
#include "services/trainer/step/step_metrics.h"
#include "services/trainer/step/step_publisher.h"
#include "services/trainer/step/step_routes.h"
#include "services/trainer/step/step_sampler.h"
#include "services/trainer/update/data_parallel_share.h"
#include "services/trainer/update/policy_update.h"
#include "services/weight_store/client/adapter_client.h"
#include "services/weight_store/client/engine_lora.h"
#include "tandem/rollout/v1/rollout.grpc.pb.h"
#include "tandem/routerreplay/v1/router_replay.grpc.pb.h"

namespace tandem::trainer {
namespace {

double SecondsSince(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

absl::Status Cancelled() { return absl::CancelledError("job cancelled"); }

// The environment's backoff and outage budget for a store that is away.
OutagePolicy OutagePolicyOf(const JobEnvironment& environment) {
  return {.initial_backoff = environment.retry_backoff, .budget = environment.store_outage_budget};
}

// JobProgress::on_status is optional.
void SayStatus(const JobProgress& progress, const std::string& status) {
  if (progress.on_status) progress.on_status(status);
}

// One run of a job on this trainer rank: the stages of a step (sampler, route fetch, policy
// update, publish, swap wait) over the run's state, in lockstep with the job's other ranks.
class JobRun {
 public:
  // Rank 0 of the job (of one rank, or leading several) when `assignment` is null; else the
  // rank it names, joining rank 0's group through `store`. `retry` numbers rank 0's runs of one
  // attempt after groups that broke (each forms a group of its own).
  JobRun(const trainer::v1::Job& job, const JobEnvironment& environment,
         const internal::v1::GetAssignmentResponse* assignment = nullptr,
         gloo::rendezvous::Store* store = nullptr, int retry = 0)
      : job_(job),
        retry_(retry),
        environment_(environment),
        assignment_(assignment),
        member_store_(store),
        rank_(assignment != nullptr ? assignment->data_parallel_rank() : 0),
        owner_{.job_id = job.id(), .spec_fingerprint = SpecFingerprint(job.spec())} {}

  absl::Status Init();
  absl::Status Run(const JobProgress& progress, const std::atomic<bool>& cancelled);

 private:
  // Rank 0: it forms the group, owns checkpoints and reports progress.
  bool lead() const { return assignment_ == nullptr; }
  // The job's ranks once their group formed; null for one rank.
  CountingCommunicator* ranks() { return group_ == nullptr ? nullptr : &group_->ranks(); }
  const trainer::v1::JobSpec& spec() const { return plan_.spec; }

  // The stubs of the job's services and the stages over them.
  absl::Status ConnectServices();
  absl::Status CreateSampler();
  // The run's starting state: rank 0's from FindStartingPoint, a rank > 0's shaped alike.
  absl::Status CreateState(JobModel model);
  // The version the run publishes first: the weight-store's newest + 1 (rank 0's, for all ranks).
  absl::StatusOr<int64_t> FirstVersion();
  // A run of several ranks: forms their Gloo groups (rank 0 posts the job and waits for the
  // others to join), sends every rank rank 0's starting state, and with expert parallelism keeps
  // the rank's experts of it.
  absl::Status JoinRanks(int64_t first_version, const JobProgress& progress);
  absl::Status KeepExperts();
  // Refuses a parallelism the adapter cannot be published by (each rank puts a shard of its own).
  absl::Status CheckPublishable() const;
  // What the expert exchange has done since the run began (zeros without one).
  struct ExchangeTotals {
    double seconds = 0;
    int64_t bytes = 0;
    int64_t rows = 0;
    double compute_seconds = 0;
  };
  ExchangeTotals Exchanged() {
    if (exchange_ == nullptr) return {};
    exchange_time_ += group_->experts()->TakeCounts().time;
    return {.seconds = absl::ToDoubleSeconds(exchange_time_),
            .bytes = exchange_->bytes_sent(),
            .rows = exchange_->rows_computed(),
            .compute_seconds = absl::ToDoubleSeconds(exchange_->compute_time())};
  }
  // The experts' placement over each expert-parallel group; null without expert parallelism.
  const engine::ExpertPlacement* Placement() const {
    return exchange_ == nullptr ? nullptr : &exchange_->placement();
  }
  // Whether the run is expert parallel, and its groups once formed.
  bool expert_parallel() const { return plan_.expert_parallel > 1; }
  PolicyUpdateConfig::ExpertParallelism ExpertGroups() {
    if (exchange_ == nullptr) return {};
    return {
        .exchange = exchange_.get(), .group = group_->experts(), .same_experts = group_->copies()};
  }
  // Between phases of a step with several ranks: every rank learns whether any failed `what`.
  absl::Status Agree(const absl::Status& local, absl::string_view what) {
    return ranks() == nullptr ? local
                              : AgreeOnFailures(*ranks(), local, what, environment_.phase_timeout);
  }
  // trainer::RideOutOutage with the environment's backoff and outage budget.
  absl::Status RideOutOutage(absl::string_view store,
                             const std::function<absl::Status(int attempt)>& call);

  // A step's phases; each fills its part of `metrics`.
  absl::StatusOr<StepRoutes> FetchRoutes(const StepSamples& samples,
                                         trainer::v1::StepMetrics& metrics);
  // A job balancing experts: re-places them by the step's routed load (RebalanceExperts).
  absl::Status Rebalance(const StepRoutes& routes, trainer::v1::StepMetrics& metrics);
  absl::StatusOr<UpdateStats> Train(int64_t step, const StepSamples& samples,
                                    const StepRoutes& routes, trainer::v1::StepMetrics& metrics);
  // Publishes the step's adapter, waits until every replica serves it, and checkpoints.
  absl::Status PublishAndSwap(int64_t step, const JobProgress& progress,
                              trainer::v1::StepMetrics& metrics);
  absl::StatusOr<trainer::v1::StepMetrics> RunStep(int64_t step, GenerationAhead& ahead,
                                                   const JobProgress& progress);

  const trainer::v1::Job job_;
  const int retry_;
  const JobEnvironment environment_;
  const internal::v1::GetAssignmentResponse* const assignment_;  // Null on rank 0.
  gloo::rendezvous::Store* const member_store_;                  // Rank 0's values, for a rank > 0.
  const int rank_;
  JobPlan plan_;                      // After Init.
  std::vector<int> own_groups_;       // The step's prompt groups this rank generates.
  std::unique_ptr<RankGroup> group_;  // A run of several ranks.
  // Expert parallelism: the MoE blocks' all-to-all over the rank's expert-parallel group.
  std::unique_ptr<engine::ExpertParallelExchange> exchange_;
  absl::Duration exchange_time_;  // In the expert group's collectives, since the run began.
  std::unique_ptr<TrainingState> state_;
  std::unique_ptr<PolicyUpdater> updater_;          // Set by Run.
  std::unique_ptr<engine::text::TextCodec> codec_;  // As rollout's: prompts sent as their ids.
  std::unique_ptr<engine::Task> task_;
  std::vector<std::unique_ptr<rollout::v1::RolloutService::StubInterface>> rollouts_;
  std::vector<rollout::ReplicaStub> replicas_;  // rollouts_ by address.
  std::unique_ptr<weight_store::WeightStoreStubs> weight_store_;
  std::unique_ptr<routerreplay::v1::RouterReplayService::StubInterface> router_replay_;
  std::unique_ptr<router_replay::RouteSource> route_source_;  // Over router_replay_.
  int64_t start_step_ = 0;
  int64_t version_ = 0;                           // The newest version the run published.
  CheckpointOwner owner_;                         // What the run's checkpoints record.
  const std::atomic<bool>* cancelled_ = nullptr;  // Set by Run.
  rollout::SampleFanOut fan_out_;         // The step's Generate calls, cancelled when the run ends.
  std::unique_ptr<StepSampler> sampler_;  // After Init.
  std::unique_ptr<StepPublisher> publisher_;  // Set by Run.
};

absl::Status JobRun::Init() {
  // The stored spec was resolved at submission and resolves to itself.
  absl::StatusOr<JobPlan> plan = PlanJob(job_.spec(), job_.id(), job_.spec().output_dir());
  if (!plan.ok()) return plan.status();
  plan_ = *std::move(plan);
  absl::StatusOr<JobModel> model = LoadJobModel(spec());
  if (!model.ok()) return model.status();
  auto codec = engine::text::TextCodecFor(spec().base_model_path());
  if (!codec.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("tokenizer: ", codec.status().message()));
  }
  codec_ = *std::move(codec);
  auto task = MakeJobTask(spec(), *codec_);
  if (!task.ok()) return task.status();
  task_ = *std::move(task);
  if (absl::Status status = ConnectServices(); !status.ok()) return status;
  if (absl::Status status = CreateSampler(); !status.ok()) return status;
  return CreateState(*std::move(model));
}

absl::Status JobRun::ConnectServices() {
  GrpcServiceDialer grpc_dialer(environment_.auth_token, environment_.auth_token_file,
                                environment_.tls);
  ServiceDialer& dialer = environment_.dialer != nullptr ? *environment_.dialer : grpc_dialer;
  const ServiceEndpoints& services = environment_.services;
  auto addresses = RolloutReplicas(services);
  if (!addresses.ok()) return addresses.status();
  if (!services.rollout_service.empty()) {
    spdlog::info("job {}: rollout replicas of {}: {}", job_.id(), services.rollout_service,
                 absl::StrJoin(*addresses, ", "));
  }
  for (const std::string& address : *addresses) {
    auto stub = dialer.Rollout(address);
    if (!stub.ok()) return stub.status();
    rollouts_.push_back(*std::move(stub));
    replicas_.push_back({.address = address, .stub = rollouts_.back().get()});
  }
  auto weight_store = dialer.WeightStore(services.weight_store);
  if (!weight_store.ok()) return weight_store.status();
  weight_store_ = *std::move(weight_store);
  if (!services.router_replay.empty()) {
    auto router_replay = dialer.RouterReplay(services.router_replay);
    if (!router_replay.ok()) return router_replay.status();
    router_replay_ = *std::move(router_replay);
    route_source_ = std::make_unique<router_replay::RouterReplaySource>(*router_replay_);
  } else if (plan_.update.replay == RouteReplay::kR3) {
    // Every rank reads its own flags: one without router-replay would train without replay.
    return absl::FailedPreconditionError(
        "the job replays routes (R3), and this trainer rank has no --router_replay");
  }
  return absl::OkStatus();
}

absl::Status JobRun::CreateSampler() {
  auto share = DataParallelShare(spec().prompts_per_step(), spec().group_size(),
                                 plan_.update.updates_per_step, plan_.ranks(), rank_);
  if (!share.ok()) return share.status();
  for (size_t i = 0; i < share->size(); i += spec().group_size()) {
    own_groups_.push_back((*share)[i] / spec().group_size());
  }
  sampler_ =
      std::make_unique<StepSampler>(StepSamplerConfig{.job_id = job_.id(),
                                                      .spec = &plan_.spec,
                                                      .own_groups = own_groups_,
                                                      .data_parallel_rank = rank_,
                                                      .record_routes = router_replay_ != nullptr,
                                                      .attempts = environment_.generate_attempts,
                                                      .retry_backoff = environment_.retry_backoff,
                                                      .rpc_timeout = environment_.rpc_timeout},
                                    *task_, *codec_, replicas_, fan_out_, Clock::Real());
  return absl::OkStatus();
}

absl::Status JobRun::CreateState(JobModel model) {
  StateOrigin origin{.read_initial_adapter = lead()};
  if (lead()) {
    absl::StatusOr<StartingPoint> start = FindStartingPoint(spec(), owner_, model.base->config());
    if (!start.ok()) return start.status();
    start_step_ = start->start_step;
    owner_.initialized_from = start->initialized_from;
    origin.checkpoint = std::move(start->checkpoint);
    origin.resuming = start_step_ > 0;
  } else {
    // A rank > 0 starts from rank 0's state (Broadcast): the checkpoints are rank 0's.
    start_step_ = assignment_->start_step();
  }
  auto state = TrainingState::Create(plan_, std::move(model), std::move(origin));
  if (!state.ok()) return state.status();
  state_ = *std::move(state);
  return CheckPublishable();
}

absl::Status JobRun::CheckPublishable() const {
  if (plan_.ranks() == 1) return absl::OkStatus();
  // Each rank publishes a shard of its own: refused now, not after the group formed.
  const auto split = expert_parallel()
                         ? weight_store::BuildExpertParallelVersion(
                               state_->lora(), state_->model_config(), spec().adapter_name(), 1,
                               engine::ExpertPlacement::Contiguous(
                                   state_->model_config().num_experts, plan_.expert_parallel),
                               plan_.data_parallel, rank_)
                         : weight_store::BuildAdapterVersion(state_->lora(), state_->model_config(),
                                                             spec().adapter_name(), 1,
                                                             type::v1::DTYPE_F32, plan_.ranks());
  if (split.ok()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      expert_parallel() ? "spec.parallelism.expert_parallel: " : "spec.parallelism.data_parallel: ",
      split.status().message()));
}

absl::StatusOr<int64_t> JobRun::FirstVersion() {
  if (!lead()) return assignment_->first_version();
  absl::StatusOr<int64_t> newest = publisher_->NewestVersion();
  if (!newest.ok()) return newest.status();
  // The adapter this run starts from (fresh, or restored) becomes a new version: a resumed job
  // never assumes that versions published after its checkpoint match its weights.
  return *newest + 1;
}

absl::Status JobRun::JoinRanks(int64_t first_version, const JobProgress& progress) {
  absl::StatusOr<std::unique_ptr<RankGroup>> group;
  if (lead()) {
    internal::v1::GetAssignmentResponse assignment;
    *assignment.mutable_job() = job_;
    assignment.set_group(absl::StrCat(job_.id(), "/a", job_.attempt(), "r", retry_));
    assignment.set_start_step(start_step_);
    assignment.set_first_version(first_version);
    group = RankGroup::Lead(
        assignment, plan_.ranks(), plan_.expert_parallel,
        {.roster = environment_.roster,
         .rendezvous = environment_.rendezvous,
         .gloo = environment_.gloo,
         .join_timeout = environment_.rank_join_timeout,
         .on_status = [&](const std::string& waiting) { SayStatus(progress, waiting); }},
        *cancelled_);
  } else {
    group = RankGroup::Join(*member_store_, rank_, plan_.ranks(), plan_.expert_parallel,
                            environment_.gloo);
  }
  if (!group.ok()) return group.status();
  group_ = *std::move(group);
  spdlog::info("job {}: rank {} of {} trains prompt groups {}", job_.id(), rank_, plan_.ranks(),
               absl::StrJoin(own_groups_, ","));
  if (absl::Status status = state_->Broadcast(*ranks()); !status.ok()) return status;
  return expert_parallel() ? KeepExperts() : absl::OkStatus();
}

absl::Status JobRun::KeepExperts() {
  auto exchange = engine::ExpertParallelExchange::Create(*group_->experts(),
                                                         state_->model_config().num_experts);
  if (!exchange.ok()) return exchange.status();
  exchange_ = *std::move(exchange);
  const std::vector<int> experts = exchange_->local_experts().experts;
  if (absl::Status status = state_->KeepExperts(plan_, experts); !status.ok()) return status;
  spdlog::info("job {}: rank {} holds experts {} of every MoE layer", job_.id(), rank_,
               absl::StrJoin(experts, ","));
  return absl::OkStatus();
}

absl::Status JobRun::RideOutOutage(absl::string_view store,
                                   const std::function<absl::Status(int attempt)>& call) {
  return trainer::RideOutOutage(store, OutagePolicyOf(environment_), *cancelled_, Clock::Real(),
                                call);
}

absl::StatusOr<StepRoutes> JobRun::FetchRoutes(const StepSamples& samples,
                                               trainer::v1::StepMetrics& metrics) {
  if (route_source_ == nullptr) return StepRoutes{};
  const absl::Time start = absl::Now();
  absl::StatusOr<StepRoutes> fetched;
  const absl::Status status = RideOutOutage("router-replay", [&](int) {
    fetched =
        FetchStepRoutes(*route_source_, samples, state_->model_config(), environment_.rpc_timeout);
    return fetched.status();
  });
  metrics.set_route_fetch_seconds(SecondsSince(start));
  if (!status.ok()) return status;
  return fetched;
}

absl::Status JobRun::Rebalance(const StepRoutes& routes, trainer::v1::StepMetrics& metrics) {
  absl::StatusOr<Rebalanced> rebalanced = RebalanceExperts(
      *ranks(), *group_->experts(), *exchange_, routes.routes, *router_replay_,
      environment_.rpc_timeout, state_->base(), state_->lora(), state_->optimizer());
  if (!rebalanced.ok()) return rebalanced.status();
  metrics.set_experts_moved(rebalanced->experts_moved);
  metrics.set_expert_imbalance_before(rebalanced->imbalance_before);
  metrics.set_expert_imbalance_after(rebalanced->imbalance_after);
  metrics.set_expert_replicas(rebalanced->replicas_made);
  updater_->UseReplicas(std::move(rebalanced->replicas));
  return absl::OkStatus();
}

absl::StatusOr<UpdateStats> JobRun::Train(int64_t step, const StepSamples& samples,
                                          const StepRoutes& routes,
                                          trainer::v1::StepMetrics& metrics) {
  const absl::Time start = absl::Now();
  absl::StatusOr<UpdateStats> stats = updater_->Update(samples.training, routes.routes);
  if (!stats.ok()) return stats.status();
  // The same on every rank: statistics and gradients are the ranks' sums.
  if (absl::Status status = state_->CheckFinite(step, *stats); !status.ok()) return status;
  if (ranks() != nullptr) {
    // Expert parallel: what is not per expert is alike on every rank, the rest on the copies.
    const engine::ParameterSet& parameters = state_->lora().parameters();
    absl::Status status = CheckIdenticalParameters(
        *ranks(), parameters, step,
        expert_parallel() ? CompareTensors::kNotPerExpert : CompareTensors::kAll);
    if (status.ok() && expert_parallel()) {
      status = CheckIdenticalParameters(*group_->copies(), parameters, step);
    }
    if (!status.ok()) return status;
  }
  // A cancel seen during training ends the step before anything is published.
  if (absl::Status status = Agree(*cancelled_ ? Cancelled() : absl::OkStatus(),
                                  absl::StrCat("step ", step, " (cancelled)"));
      !status.ok()) {
    return status;
  }
  metrics.set_training_seconds(SecondsSince(start));
  return stats;
}

absl::Status JobRun::PublishAndSwap(int64_t step, const JobProgress& progress,
                                    trainer::v1::StepMetrics& metrics) {
  absl::Time start = absl::Now();
  if (absl::Status status = publisher_->Publish(state_->lora(), state_->model_config(),
                                                version_ + 1, step, ranks(), Placement());
      !status.ok()) {
    return status;
  }
  ++version_;
  metrics.set_publish_seconds(SecondsSince(start));
  progress.on_published(version_);
  start = absl::Now();
  absl::Status swapped = publisher_->AwaitServed(version_);
  metrics.set_swap_seconds(SecondsSince(start));
  if (!expert_parallel()) {
    if (swapped.ok() && lead() && plan_.CheckpointsAfter(step)) {
      swapped = state_->SaveCheckpoint(spec().output_dir(), owner_, step, version_);
    }
    return Agree(swapped, absl::StrCat("step ", step, "'s swap or checkpoint"));
  }
  // Every rank joins its group's experts for rank 0's checkpoint: all agree first.
  if (absl::Status status = Agree(swapped, absl::StrCat("step ", step, "'s swap")); !status.ok()) {
    return status;
  }
  if (!plan_.CheckpointsAfter(step)) return absl::OkStatus();
  return Agree(state_->SaveCheckpoint(spec().output_dir(), owner_, step, version_,
                                      group_->experts(), lead()),
               absl::StrCat("step ", step, "'s checkpoint"));
}

absl::StatusOr<trainer::v1::StepMetrics> JobRun::RunStep(int64_t step, GenerationAhead& ahead,
                                                         const JobProgress& progress) {
  trainer::v1::StepMetrics metrics;
  metrics.set_step(step);
  const absl::Time step_start = absl::Now();
  if (ranks() != nullptr) ranks()->TakeCounts();  // This step's from here.
  const ExchangeTotals exchanged_before = Exchanged();
  // A cancel ends the step on every rank at the agreement below.
  GenerationAhead::Taken taken =
      *cancelled_ ? GenerationAhead::Taken{.samples = Cancelled(), .version = version_}
                  : ahead.Take(step, version_);
  metrics.set_min_rollout_version(taken.version);
  metrics.set_generation_seconds(SecondsSince(step_start));
  if (taken.samples.ok()) ahead.StartAfter(step, version_);
  absl::StatusOr<StepRoutes> routes = taken.samples.ok()
                                          ? FetchRoutes(*taken.samples, metrics)
                                          : absl::StatusOr<StepRoutes>(taken.samples.status());
  if (absl::Status status = Agree(*cancelled_ ? Cancelled() : routes.status(),
                                  absl::StrCat("step ", step, "'s generation"));
      !status.ok()) {
    return status;
  }
  const StepSamples& samples = *taken.samples;
  if (plan_.balance_experts) {
    if (absl::Status status = Rebalance(*routes, metrics); !status.ok()) return status;
  }
  absl::StatusOr<UpdateStats> stats = Train(step, samples, *routes, metrics);
  if (!stats.ok()) return stats.status();
  if (absl::Status status = PublishAndSwap(step, progress, metrics); !status.ok()) return status;
  const ExchangeTotals exchanged = Exchanged();
  metrics.set_expert_exchange_seconds(exchanged.seconds - exchanged_before.seconds);
  metrics.set_expert_exchange_bytes(exchanged.bytes - exchanged_before.bytes);
  std::vector<float> tallies =
      TalliesOf(samples, routes->missing_entries, routes->entries,
                {.rows = exchanged.rows - exchanged_before.rows,
                 .seconds = exchanged.compute_seconds - exchanged_before.compute_seconds});
  if (ranks() != nullptr) {
    absl::StatusOr<std::vector<float>> gathered = GatherFromRanks(*ranks(), tallies);
    if (!gathered.ok()) return gathered.status();
    tallies = *std::move(gathered);
    const CountingCommunicator::Counts collectives = ranks()->TakeCounts();
    metrics.set_collective_seconds(absl::ToDoubleSeconds(collectives.time));
    metrics.set_collective_bytes(collectives.bytes);
  }
  SetSampleMetrics(tallies, metrics);
  metrics.set_policy_version(version_);
  SetUpdateMetrics(*stats, metrics);
  metrics.set_step_seconds(SecondsSince(step_start));
  return metrics;
}

absl::Status JobRun::Run(const JobProgress& progress, const std::atomic<bool>& cancelled) {
  cancelled_ = &cancelled;
  publisher_ = std::make_unique<StepPublisher>(
      StepPublisherConfig{.job_id = job_.id(),
                          .adapter_name = spec().adapter_name(),
                          .architecture = state_->architecture(),
                          .ranks = plan_.ranks(),
                          .ucx = environment_.ucx,
                          .rpc_timeout = environment_.rpc_timeout,
                          .phase_timeout = environment_.phase_timeout,
                          .outage = OutagePolicyOf(environment_),
                          .swap = {.timeout = environment_.swap_timeout,
                                   .poll_initial = environment_.swap_poll_initial,
                                   .poll_max = environment_.swap_poll_max}},
      *weight_store_, replicas_, cancelled, Clock::Real());
  progress.on_attempt_start(start_step_);
  absl::StatusOr<int64_t> first_version = FirstVersion();
  if (!first_version.ok()) return first_version.status();
  if (plan_.ranks() > 1) {
    if (absl::Status status = JoinRanks(*first_version, progress); !status.ok()) return status;
  }
  absl::StatusOr<engine::TrainingEngines> engines = engine::MakeTrainingEngines(
      environment_.device, state_->base(), state_->lora(), exchange_.get());
  if (!engines.ok()) return engines.status();
  updater_ = std::make_unique<PolicyUpdater>(state_->base(), state_->lora(), state_->optimizer(),
                                             state_->UpdateConfig(plan_, ranks(), ExpertGroups()),
                                             *std::move(engines));
  if (absl::Status status = publisher_->Publish(state_->lora(), state_->model_config(),
                                                *first_version, start_step_, ranks(), Placement());
      !status.ok()) {
    return status;
  }
  version_ = *first_version;
  progress.on_published(version_);
  GenerationAhead ahead(
      [this](int64_t step, int64_t version) { return sampler_->Generate(step, version); },
      [this](int64_t version) -> std::shared_ptr<void> {
        return VersionPin::Take(*weight_store_, spec().adapter_name(), version,
                                absl::StrCat("trainer/", job_.id()), environment_.rpc_timeout);
      },
      [this] { fan_out_.Abandon(); }, plan_.lookahead, spec().num_steps());
  for (int64_t step = start_step_ + 1; step <= spec().num_steps(); ++step) {
    absl::StatusOr<trainer::v1::StepMetrics> metrics = RunStep(step, ahead, progress);
    if (!metrics.ok()) return metrics.status();
    progress.on_step(*metrics);
  }
  return absl::OkStatus();
}

}  // namespace

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
