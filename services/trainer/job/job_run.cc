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
#include "placement/expert_rebalance.h"
#include "services/rollout/client/sample_fan_out.h"
#include "services/router_replay/client/route_source.h"
#include "services/trainer/api/job_spec.h"
#include "services/trainer/job/checkpoint.h"
#include "services/trainer/job/generation_ahead.h"
#include "services/trainer/job/job_connections.h"
#include "services/trainer/job/job_plan.h"
#include "services/trainer/job/run_ranks.h"
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
  return {.initial_backoff = environment.settings.retry_backoff,
          .budget = environment.settings.store_outage_budget};
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
  // attempt after groups that broke (each forms a group of its own). `environment` must outlive
  // the run.
  JobRun(const trainer::v1::Job& job, const JobEnvironment& environment,
         const internal::v1::GetAssignmentResponse* assignment = nullptr,
         gloo::rendezvous::Store* store = nullptr, int retry = 0)
      : job_(job),
        environment_(environment),
        ranks_(std::make_unique<RunRanks>(assignment, store, retry)) {}

  absl::Status Init();
  absl::Status Run(const JobProgress& progress, const std::atomic<bool>& cancelled);

 private:
  // What the run's checkpoints record.
  CheckpointOwner Owner() const {
    return {.job_id = job_.id(),
            .spec_fingerprint = SpecFingerprint(job_.spec()),
            .initialized_from = initialized_from_};
  }
  const trainer::v1::JobSpec& spec() const { return plan_->spec; }
  const JobSettings& settings() const { return environment_.settings; }
  CountingCommunicator* ranks() { return ranks_->ranks(); }
  bool expert_parallel() const { return plan_->expert_parallel > 1; }

  // The run's starting state: rank 0's from FindStartingPoint, a rank > 0's shaped alike.
  absl::Status CreateState(JobModel model);
  // The generation stage over the rollout replicas: this rank's share of the step's prompts,
  // with the job's task and text codec.
  absl::Status CreateSampler(std::shared_ptr<const engine::text::TextCodec> codec,
                             std::shared_ptr<const engine::Task> task);
  // The version the run publishes first: the weight-store's newest + 1 (rank 0's, for all ranks).
  absl::StatusOr<int64_t> FirstVersion();
  // A run of several ranks: forms their Gloo groups (rank 0 posts the job and waits for the
  // others to join), sends every rank rank 0's starting state, and with expert parallelism keeps
  // the rank's experts of it.
  absl::Status JoinRanks(int64_t first_version, const JobProgress& progress,
                         const std::atomic<bool>& cancelled);
  absl::Status KeepExperts();
  // Refuses a parallelism the adapter cannot be published by (each rank puts a shard of its own).
  absl::Status CheckPublishable() const;
  // Between phases of a step with several ranks: every rank learns whether any failed `what`.
  absl::Status Agree(const absl::Status& local, absl::string_view what) {
    return ranks_->Agree(local, what, settings().phase_timeout);
  }
  // A step's phases; each fills its part of `metrics`, and each ends once `cancelled` is seen.
  absl::StatusOr<StepRoutes> FetchRoutes(const StepSamples& samples,
                                         trainer::v1::StepMetrics& metrics,
                                         const std::atomic<bool>& cancelled);
  // A job balancing experts: re-places them by the step's routed load (RebalanceExperts).
  absl::Status Rebalance(const StepRoutes& routes, trainer::v1::StepMetrics& metrics);
  absl::StatusOr<UpdateStats> Train(int64_t step, const StepSamples& samples,
                                    const StepRoutes& routes, trainer::v1::StepMetrics& metrics,
                                    const std::atomic<bool>& cancelled);
  // Publishes the step's adapter, waits until every replica serves it, and checkpoints.
  absl::Status PublishAndSwap(int64_t step, const JobProgress& progress,
                              trainer::v1::StepMetrics& metrics);
  absl::StatusOr<trainer::v1::StepMetrics> RunStep(int64_t step, GenerationAhead& ahead,
                                                   const JobProgress& progress,
                                                   const std::atomic<bool>& cancelled);

  // Configuration: what the run is asked to do, and the trainer's settings and services.
  const trainer::v1::Job job_;
  const JobEnvironment& environment_;
  std::unique_ptr<const JobPlan> plan_;  // After Init.
  // The stages, wired once: where the run sits among the job's ranks, the services it talks
  // to, its generation, its state, its update and its publishing.
  const std::unique_ptr<RunRanks> ranks_;
  std::unique_ptr<JobConnections> connections_;  // After Init.
  std::unique_ptr<StepSampler> sampler_;         // After Init.
  std::unique_ptr<TrainingState> state_;         // After Init.
  std::unique_ptr<PolicyUpdater> updater_;       // Set by Run.
  std::unique_ptr<StepPublisher> publisher_;     // Set by Run.
  // Where the run stands: the step it started after, the checkpoint it was initialized from
  // (CheckpointOwner), and the newest version it published.
  int64_t start_step_ = 0;
  std::string initialized_from_;
  int64_t version_ = 0;
};

absl::Status JobRun::Init() {
  // The stored spec was resolved at submission and resolves to itself.
  absl::StatusOr<JobPlan> plan = PlanJob(job_.spec(), job_.id(), job_.spec().output_dir());
  if (!plan.ok()) return plan.status();
  plan_ = std::make_unique<const JobPlan>(*std::move(plan));
  absl::StatusOr<JobModel> model = LoadJobModel(spec());
  if (!model.ok()) return model.status();
  auto codec = engine::text::TextCodecFor(spec().base_model_path());
  if (!codec.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("tokenizer: ", codec.status().message()));
  }
  std::shared_ptr<const engine::text::TextCodec> shared_codec = *std::move(codec);
  auto task = MakeJobTask(spec(), *shared_codec);
  if (!task.ok()) return task.status();
  GrpcServiceDialer grpc_dialer(settings().auth_token, settings().auth_token_file, settings().tls);
  absl::StatusOr<std::unique_ptr<JobConnections>> connections = JobConnections::Dial(
      settings().services,
      environment_.dependencies.dialer != nullptr ? *environment_.dependencies.dialer : grpc_dialer,
      job_.id(), plan_->update.replay == RouteReplay::kR3);
  if (!connections.ok()) return connections.status();
  connections_ = *std::move(connections);
  if (absl::Status status = CreateSampler(std::move(shared_codec), *std::move(task));
      !status.ok()) {
    return status;
  }
  return CreateState(*std::move(model));
}

absl::Status JobRun::CreateSampler(std::shared_ptr<const engine::text::TextCodec> codec,
                                   std::shared_ptr<const engine::Task> task) {
  const int rank = ranks_->rank();
  auto share = DataParallelShare(spec().prompts_per_step(), spec().group_size(),
                                 plan_->update.updates_per_step, plan_->ranks(), rank);
  if (!share.ok()) return share.status();
  std::vector<int> own_groups;
  for (size_t i = 0; i < share->size(); i += spec().group_size()) {
    own_groups.push_back((*share)[i] / spec().group_size());
  }
  if (plan_->ranks() > 1) {
    spdlog::info("job {}: rank {} of {} trains prompt groups {}", job_.id(), rank, plan_->ranks(),
                 absl::StrJoin(own_groups, ","));
  }
  sampler_ = std::make_unique<StepSampler>(
      StepSamplerConfig{.job_id = job_.id(),
                        .spec = &plan_->spec,
                        .own_groups = std::move(own_groups),
                        .data_parallel_rank = rank,
                        .record_routes = connections_->router_replay() != nullptr,
                        .attempts = settings().generate_attempts,
                        .retry_backoff = settings().retry_backoff,
                        .rpc_timeout = settings().rpc_timeout},
      std::move(task), std::move(codec), connections_->replicas(), connections_->fan_out(),
      Clock::Real());
  return absl::OkStatus();
}

absl::Status JobRun::CreateState(JobModel model) {
  StateOrigin origin{.read_initial_adapter = ranks_->lead()};
  if (ranks_->lead()) {
    absl::StatusOr<StartingPoint> start = FindStartingPoint(spec(), Owner(), model.base->config());
    if (!start.ok()) return start.status();
    start_step_ = start->start_step;
    initialized_from_ = start->initialized_from;
    origin.checkpoint = std::move(start->checkpoint);
    origin.resuming = start_step_ > 0;
  } else {
    // A rank > 0 starts from rank 0's state (Broadcast): the checkpoints are rank 0's.
    start_step_ = ranks_->assignment().start_step();
  }
  auto state = TrainingState::Create(*plan_, std::move(model), std::move(origin));
  if (!state.ok()) return state.status();
  state_ = *std::move(state);
  return CheckPublishable();
}

absl::Status JobRun::CheckPublishable() const {
  if (plan_->ranks() == 1) return absl::OkStatus();
  // Each rank publishes a shard of its own: refused now, not after the group formed.
  const auto split = expert_parallel()
                         ? weight_store::BuildExpertParallelVersion(
                               state_->lora(), state_->model_config(), spec().adapter_name(), 1,
                               placement::LayerPlacements::Uniform(
                                   placement::ExpertPlacement::Contiguous(
                                       state_->model_config().num_experts, plan_->expert_parallel),
                                   state_->model_config().num_moe_layers()),
                               plan_->data_parallel, ranks_->rank())
                         : weight_store::BuildAdapterVersion(state_->lora(), state_->model_config(),
                                                             spec().adapter_name(), 1,
                                                             type::v1::DTYPE_F32, plan_->ranks());
  if (split.ok()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      expert_parallel() ? "spec.parallelism.expert_parallel: " : "spec.parallelism.data_parallel: ",
      split.status().message()));
}

absl::StatusOr<int64_t> JobRun::FirstVersion() {
  if (!ranks_->lead()) return ranks_->assignment().first_version();
  absl::StatusOr<int64_t> newest = publisher_->NewestVersion();
  if (!newest.ok()) return newest.status();
  // The adapter this run starts from (fresh, or restored) becomes a new version: a resumed job
  // never assumes that versions published after its checkpoint match its weights.
  return *newest + 1;
}

absl::Status JobRun::JoinRanks(int64_t first_version, const JobProgress& progress,
                               const std::atomic<bool>& cancelled) {
  internal::v1::GetAssignmentResponse assignment;  // What rank 0 posts.
  if (ranks_->lead()) {
    *assignment.mutable_job() = job_;
    assignment.set_group(absl::StrCat(job_.id(), "/a", job_.attempt(), "r", ranks_->retry()));
    assignment.set_start_step(start_step_);
    assignment.set_first_version(first_version);
  }
  if (absl::Status status = ranks_->Form(
          assignment, plan_->ranks(), plan_->expert_parallel,
          {.roster = environment_.dependencies.roster,
           .rendezvous = environment_.dependencies.rendezvous,
           .gloo = settings().gloo,
           .join_timeout = settings().rank_join_timeout,
           .on_status = [&](const std::string& waiting) { SayStatus(progress, waiting); }},
          cancelled);
      !status.ok()) {
    return status;
  }
  if (absl::Status status = state_->Broadcast(*ranks()); !status.ok()) return status;
  return expert_parallel() ? KeepExperts() : absl::OkStatus();
}

absl::Status JobRun::KeepExperts() {
  absl::StatusOr<std::vector<int>> experts = ranks_->ExchangeExperts(state_->model_config());
  if (!experts.ok()) return experts.status();
  if (absl::Status status = state_->KeepExperts(*plan_, *experts); !status.ok()) return status;
  spdlog::info("job {}: rank {} holds experts {} of every MoE layer", job_.id(), ranks_->rank(),
               absl::StrJoin(*experts, ","));
  return absl::OkStatus();
}

absl::StatusOr<StepRoutes> JobRun::FetchRoutes(const StepSamples& samples,
                                               trainer::v1::StepMetrics& metrics,
                                               const std::atomic<bool>& cancelled) {
  if (connections_->route_source() == nullptr) return StepRoutes{};
  const absl::Time start = absl::Now();
  absl::StatusOr<StepRoutes> fetched;
  const absl::Status status = RideOutOutage(
      "router-replay", OutagePolicyOf(environment_), cancelled, Clock::Real(), [&](int) {
        fetched = FetchStepRoutes(*connections_->route_source(), samples, state_->model_config(),
                                  settings().rpc_timeout);
        return fetched.status();
      });
  metrics.set_route_fetch_seconds(SecondsSince(start));
  if (!status.ok()) return status;
  return fetched;
}

absl::Status JobRun::Rebalance(const StepRoutes& routes, trainer::v1::StepMetrics& metrics) {
  // Moves and replicas priced at the deployment's link rate against the experts' compute the run
  // measured so far (not the all-to-all's rate: its waits for the busiest rank are what
  // balancing removes).
  const RunRanks::ExchangeTotals so_far = ranks_->Exchanged();
  const PolicyUpdater::ExpertPasses passes = updater_->ExpertPassesPerStep();
  const placement::BalanceCosts costs{
      .link_bytes_per_second = settings().expert_link_bytes_per_second,
      .seconds_per_row = so_far.rows > 0 ? so_far.compute_seconds / so_far.rows : 0,
      .passes_per_step = passes.all,
      .replica_passes_per_step = passes.with_replicas,
      .replica_holds_per_step = passes.replica_holds};
  absl::StatusOr<placement::Rebalanced> rebalanced =
      placement::RebalanceExperts(*ranks(), *ranks_->experts(), *ranks_->exchange(), routes.routes,
                                  costs, state_->base(), state_->lora(), state_->optimizer());
  if (!rebalanced.ok()) return rebalanced.status();
  metrics.set_experts_moved(rebalanced->experts_moved);
  metrics.set_expert_imbalance_before(rebalanced->before.mean);
  metrics.set_expert_imbalance_after(rebalanced->after.mean);
  metrics.set_expert_imbalance_worst_before(rebalanced->before.worst);
  metrics.set_expert_imbalance_worst_after(rebalanced->after.worst);
  metrics.set_expert_bytes_moved(rebalanced->bytes_moved);
  metrics.set_expert_replicas(rebalanced->replicas_made);
  updater_->UseReplicas(std::move(rebalanced->replicas));
  return absl::OkStatus();
}

absl::StatusOr<UpdateStats> JobRun::Train(int64_t step, const StepSamples& samples,
                                          const StepRoutes& routes,
                                          trainer::v1::StepMetrics& metrics,
                                          const std::atomic<bool>& cancelled) {
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
      status = CheckIdenticalParameters(*ranks_->copies(), parameters, step);
    }
    if (!status.ok()) return status;
  }
  // A cancel seen during training ends the step before anything is published.
  if (absl::Status status = Agree(cancelled ? Cancelled() : absl::OkStatus(),
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
                                                version_ + 1, step, ranks(), ranks_->Placements());
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
    if (swapped.ok() && ranks_->lead() && plan_->CheckpointsAfter(step)) {
      swapped = state_->SaveCheckpoint(spec().output_dir(), Owner(), step, version_);
    }
    return Agree(swapped, absl::StrCat("step ", step, "'s swap or checkpoint"));
  }
  // Every rank joins its group's experts for rank 0's checkpoint: all agree first.
  if (absl::Status status = Agree(swapped, absl::StrCat("step ", step, "'s swap")); !status.ok()) {
    return status;
  }
  if (!plan_->CheckpointsAfter(step)) return absl::OkStatus();
  return Agree(state_->SaveCheckpoint(spec().output_dir(), Owner(), step, version_,
                                      ranks_->experts(), ranks_->lead()),
               absl::StrCat("step ", step, "'s checkpoint"));
}

absl::StatusOr<trainer::v1::StepMetrics> JobRun::RunStep(int64_t step, GenerationAhead& ahead,
                                                         const JobProgress& progress,
                                                         const std::atomic<bool>& cancelled) {
  trainer::v1::StepMetrics metrics;
  metrics.set_step(step);
  const absl::Time step_start = absl::Now();
  if (ranks() != nullptr) ranks()->TakeCounts();  // This step's from here.
  const RunRanks::ExchangeTotals exchanged_before = ranks_->Exchanged();
  // A cancel ends the step on every rank at the agreement below.
  GenerationAhead::Taken taken =
      cancelled ? GenerationAhead::Taken{.samples = Cancelled(), .version = version_}
                : ahead.Take(step, version_);
  metrics.set_min_rollout_version(taken.version);
  metrics.set_generation_seconds(SecondsSince(step_start));
  if (taken.samples.ok()) ahead.StartAfter(step, version_);
  absl::StatusOr<StepRoutes> routes = taken.samples.ok()
                                          ? FetchRoutes(*taken.samples, metrics, cancelled)
                                          : absl::StatusOr<StepRoutes>(taken.samples.status());
  if (absl::Status status = Agree(cancelled ? Cancelled() : routes.status(),
                                  absl::StrCat("step ", step, "'s generation"));
      !status.ok()) {
    return status;
  }
  const StepSamples& samples = *taken.samples;
  if (plan_->balance_experts) {
    if (absl::Status status = Rebalance(*routes, metrics); !status.ok()) return status;
  }
  absl::StatusOr<UpdateStats> stats = Train(step, samples, *routes, metrics, cancelled);
  if (!stats.ok()) return stats.status();
  if (absl::Status status = PublishAndSwap(step, progress, metrics); !status.ok()) return status;
  const RunRanks::ExchangeTotals exchanged = ranks_->Exchanged();
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
  publisher_ = std::make_unique<StepPublisher>(
      StepPublisherConfig{.job_id = job_.id(),
                          .adapter_name = spec().adapter_name(),
                          .architecture = state_->architecture(),
                          .ranks = plan_->ranks(),
                          .ucx = environment_.dependencies.ucx,
                          .rpc_timeout = settings().rpc_timeout,
                          .phase_timeout = settings().phase_timeout,
                          .outage = OutagePolicyOf(environment_),
                          .swap = {.timeout = settings().swap_timeout,
                                   .poll_initial = settings().swap_poll_initial,
                                   .poll_max = settings().swap_poll_max}},
      connections_->weight_store(), connections_->replicas(), cancelled, Clock::Real());
  progress.on_attempt_start(start_step_);
  absl::StatusOr<int64_t> first_version = FirstVersion();
  if (!first_version.ok()) return first_version.status();
  if (plan_->ranks() > 1) {
    if (absl::Status status = JoinRanks(*first_version, progress, cancelled); !status.ok()) {
      return status;
    }
  }
  absl::StatusOr<engine::TrainingEngines> engines = engine::MakeTrainingEngines(
      settings().device, state_->base(), state_->lora(), ranks_->exchange());
  if (!engines.ok()) return engines.status();
  updater_ = std::make_unique<PolicyUpdater>(
      state_->base(), state_->lora(), state_->optimizer(),
      state_->UpdateConfig(*plan_, ranks(), ranks_->ExpertGroups()), *std::move(engines));
  if (absl::Status status =
          publisher_->Publish(state_->lora(), state_->model_config(), *first_version, start_step_,
                              ranks(), ranks_->Placements());
      !status.ok()) {
    return status;
  }
  version_ = *first_version;
  progress.on_published(version_);
  GenerationAhead ahead(
      [this](int64_t step, int64_t version) { return sampler_->Generate(step, version); },
      [this](int64_t version) -> std::shared_ptr<void> {
        return VersionPin::Take(connections_->weight_store(), spec().adapter_name(), version,
                                absl::StrCat("trainer/", job_.id()), settings().rpc_timeout);
      },
      [this] { connections_->fan_out().Abandon(); }, plan_->lookahead, spec().num_steps());
  for (int64_t step = start_step_ + 1; step <= spec().num_steps(); ++step) {
    absl::StatusOr<trainer::v1::StepMetrics> metrics = RunStep(step, ahead, progress, cancelled);
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
    if (status.ok() || !IsBrokenGroup(status) ||
        retry >= environment.settings.rank_failure_retries || cancelled) {
      return status;
    }
    // A rank died or stalled: the job goes on from its last checkpoint in a new group, once
    // every rank has joined again (a restarted pod, or the same ranks after a stall).
    spdlog::warn(
        "job {}: a trainer rank failed ({}); going on from the last checkpoint (retry {} "
        "of {})",
        job.id(), status.ToString(), retry + 1, environment.settings.rank_failure_retries);
    SayStatus(progress, absl::StrCat("a trainer rank failed (", status.message(),
                                     "); going on from the last checkpoint"));
    absl::SleepFor(environment.settings.rank_retry_delay);
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
