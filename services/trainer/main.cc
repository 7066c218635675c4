#include <atomic>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/logging.h"
#include "common/peer_tls.h"
#include "common/service_main.h"
#include "common/status.h"
#include "engine/blas_threads_flag.h"
#include "engine/cuda/device_engines.h"
#include "services/trainer/api/job_service.h"
#include "services/trainer/job/service_endpoints.h"
#include "services/trainer/ranks/communicator_ids.h"
#include "services/trainer/ranks/rank_roster.h"
#include "services/trainer/ranks/rank_worker.h"
#include "services/trainer/ranks/rendezvous_values.h"
#include "services/trainer/ranks/trainer_ranks_service.h"

ABSL_FLAG(std::string, data_dir, "trainer-data",
          "Job records and, by default, each job's checkpoint directory (<data_dir>/<job id>).");
ABSL_FLAG(bool, ucx, true, "Publish adapters to weight-store by UCX put when it serves UCX.");
ABSL_FLAG(std::string, ucx_transports, "", "UCX transports (as UCX_TLS); empty: UCX's choice.");
ABSL_FLAG(absl::Duration, store_outage_budget, absl::Seconds(60),
          "How long a running job waits out an unavailable weight-store or router-replay "
          "(restarting, full disk) before it fails.");
// Where jobs find the other services (service_endpoints.h): the deployment's, not a job's.
ABSL_FLAG(std::vector<std::string>, rollout, {},
          "Rollout replicas (comma-separated addresses); this or --rollout_service is required.");
ABSL_FLAG(std::string, rollout_service, "",
          "Rollout replicas as a headless Service name:port: every address the name resolves "
          "to is a replica, looked up whenever a job starts or resumes.");
ABSL_FLAG(std::string, weight_store, "", "Weight-store address (required).");
ABSL_FLAG(std::string, router_replay, "",
          "Router-replay address; without it jobs cannot use R3 routing replay.");
ABSL_FLAG(std::string, device, "cpu",
          "Where jobs train: cpu, or cuda / cuda:N (a GPU; fp32, standard attention).");
// The trainer deployment's ranks (trainer.proto's Parallelism).
ABSL_FLAG(int, rank, 0,
          "This trainer's rank: 0 serves the Job API and leads multi-rank jobs; 1..ranks-1 "
          "join them (they serve no Job API).");
ABSL_FLAG(int, ranks, 1,
          "Trainer processes in the deployment; jobs may ask for up to this many data-parallel "
          "ranks.");
ABSL_FLAG(std::string, rank0, "", "Rank 0's trainer address (host:port); required for rank > 0.");
ABSL_FLAG(std::string, rank_address, "127.0.0.1",
          "The address this rank's peers reach its collectives on (its pod's IP in a cluster).");
ABSL_FLAG(absl::Duration, collective_timeout, absl::Seconds(60),
          "Bound on forming a multi-rank job's group and on each of its collectives: a rank that "
          "died or stalls fails the step within it.");
ABSL_FLAG(absl::Duration, rank_join_timeout, absl::Minutes(2),
          "How long a multi-rank job waits for its ranks to join (and load the model) before it "
          "fails naming them.");
ABSL_FLAG(absl::Duration, ended_job_metrics_grace, absl::Minutes(2),
          "How long an ended job's per-step series stay exported (so that scrapes see its last "
          "step) before they are removed.");
ABSL_FLAG(double, expert_link_gbps, 0,
          "The link rate between expert-parallel trainer ranks, in Gbit/s: balance_experts moves "
          "or replicates an expert only when the compute it saves outlasts its bytes at this rate "
          "(0: unknown; a move is priced at a tenth of an expert's load, replicas at nothing).");
ABSL_FLAG(int, rank_failure_retries, 3,
          "How often a multi-rank job whose rank died or stalled goes on from its last "
          "checkpoint (a new attempt, once all its ranks have joined again) before it fails.");
ABSL_FLAG(absl::Duration, rank_phase_timeout, absl::Minutes(15),
          "How long a multi-rank job's ranks wait for each other between a step's phases, where "
          "one may still be generating or riding out a store outage, before the step fails.");

namespace {

// Where jobs find the other services, from the flags; INVALID_ARGUMENT naming a bad flag.
absl::StatusOr<tandem::trainer::ServiceEndpoints> ServiceEndpointsFromFlags() {
  tandem::trainer::ServiceEndpoints endpoints{
      .rollout = absl::GetFlag(FLAGS_rollout),
      .rollout_service = absl::GetFlag(FLAGS_rollout_service),
      .weight_store = absl::GetFlag(FLAGS_weight_store),
      .router_replay = absl::GetFlag(FLAGS_router_replay)};
  if (absl::Status status = tandem::trainer::CheckServiceEndpoints(endpoints); !status.ok()) {
    return status;
  }
  return endpoints;
}

// The trainer's UCX worker lives as long as the process.
tandem::transfer::UcxWorker* MaybeUcx() {
  if (!absl::GetFlag(FLAGS_ucx)) return nullptr;
  static auto* worker = [] {
    auto created =
        tandem::transfer::UcxWorker::Create({.transports = absl::GetFlag(FLAGS_ucx_transports)});
    if (!created.ok()) {
      spdlog::warn("UCX unavailable ({}); adapters are published over gRPC",
                   created.status().ToString());
      return static_cast<tandem::transfer::UcxWorker*>(nullptr);
    }
    return created->release();
  }();
  return worker;
}

absl::Status CheckRankFlags() {
  const int rank = absl::GetFlag(FLAGS_rank), ranks = absl::GetFlag(FLAGS_ranks);
  if (ranks < 1 || rank < 0 || rank >= ranks) {
    return tandem::InvalidRequest("INVALID_FLAG", absl::StrCat("--rank=", rank, " --ranks=", ranks,
                                                               ": need 0 <= rank < ranks"));
  }
  if (absl::GetFlag(FLAGS_rank_failure_retries) < 0) {
    return tandem::InvalidRequest("INVALID_FLAG", "--rank_failure_retries must be >= 0");
  }
  if (const double gbps = absl::GetFlag(FLAGS_expert_link_gbps); !(gbps >= 0) || std::isinf(gbps)) {
    return tandem::InvalidRequest("INVALID_FLAG", "--expert_link_gbps must be finite and >= 0");
  }
  if (rank > 0 && absl::GetFlag(FLAGS_rank0).empty()) {
    return tandem::InvalidRequest("INVALID_FLAG",
                                  "--rank0 (rank 0's address) is required for --rank > 0");
  }
  if (absl::GetFlag(FLAGS_collective_timeout) <= absl::ZeroDuration() ||
      absl::GetFlag(FLAGS_rank_join_timeout) <= absl::ZeroDuration() ||
      absl::GetFlag(FLAGS_rank_phase_timeout) <= absl::ZeroDuration()) {
    return tandem::InvalidRequest(
        "INVALID_FLAG",
        "--collective_timeout, --rank_join_timeout and --rank_phase_timeout must be > 0");
  }
  return absl::OkStatus();
}

// A rank > 0 serves no API: it joins the jobs rank 0 leads.
absl::StatusOr<std::vector<tandem::HostedService>> JoinRankZero(
    int rank, const tandem::trainer::JobEnvironment& environment) {
  auto channel = tandem::CreateChannel({.target = absl::GetFlag(FLAGS_rank0),
                                        .service_name = "tandem.internal.v1.TrainerRanksService",
                                        .auth_token = environment.settings.auth_token,
                                        .auth_token_file = environment.settings.auth_token_file,
                                        .tls = environment.settings.tls});
  if (!channel.ok()) return channel.status();
  // Runs for the life of the process; destroyed at exit, which ends its job at the next phase.
  static std::unique_ptr<tandem::trainer::RankWorker> worker;
  worker = std::make_unique<tandem::trainer::RankWorker>(
      rank, tandem::internal::v1::TrainerRanksService::NewStub(*channel), environment);
  spdlog::info("trainer rank {} of {}: joining the jobs of rank 0 at {}", rank,
               absl::GetFlag(FLAGS_ranks), absl::GetFlag(FLAGS_rank0));
  return std::vector<tandem::HostedService>();
}

}  // namespace

int main(int argc, char** argv) {
  return tandem::RunServiceMain(
      argc, argv,
      {.name = "trainer",
       .usage = "Tandem trainer: the Job API. Runs GRPO on a LoRA adapter of an MoE model with "
                "rollout, weight-store and router-replay.",
       .defaults = {.port = 50051, .metrics_port = 9451, .max_message_bytes = 16 << 20},
       .make_services = [](const tandem::ServerOptions& server)
           -> absl::StatusOr<std::vector<tandem::HostedService>> {
         if (auto threads = tandem::engine::ApplyBlasThreadsFlag(); !threads.ok()) {
           return threads.status();
         }
         auto peer_tls = tandem::PeerTlsFromFlags();
         if (!peer_tls.ok()) return peer_tls.status();
         const absl::Duration outage_budget = absl::GetFlag(FLAGS_store_outage_budget);
         if (outage_budget < absl::ZeroDuration()) {
           return tandem::InvalidRequest("INVALID_FLAG", "--store_outage_budget must be >= 0");
         }
         // A bad --device fails at startup, not in the first job.
         const std::string device = absl::GetFlag(FLAGS_device);
         absl::StatusOr<std::string> described = tandem::engine::DescribeDevice(device);
         if (!described.ok()) {
           return tandem::Annotate(described.status(), absl::StrCat("--device=", device, ": "));
         }
         spdlog::info("jobs train on {}", *described);
         if (absl::Status status = CheckRankFlags(); !status.ok()) return status;
         // The communicator ids and rendezvous values of the groups this trainer leads as rank
         // 0, and the deployment's other ranks, for the multi-rank jobs it runs.
         static auto* communicator_ids = new tandem::trainer::CommunicatorIds();
         static auto* rendezvous = new tandem::trainer::RendezvousValues();
         static auto* roster = new tandem::trainer::RankRoster(absl::GetFlag(FLAGS_ranks));
         auto endpoints = ServiceEndpointsFromFlags();
         if (!endpoints.ok()) return endpoints.status();
         const tandem::trainer::JobEnvironment environment = {
             .settings = {.services = *endpoints,
                          .auth_token = server.auth_token,
                          .auth_token_file = server.auth_token_file,
                          .tls = *std::move(peer_tls),
                          .device = device,
                          .store_outage_budget = outage_budget,
                          .gloo = {.hostname = absl::GetFlag(FLAGS_rank_address),
                                   .timeout = absl::GetFlag(FLAGS_collective_timeout),
                                   .join_timeout = absl::GetFlag(FLAGS_rank_join_timeout)},
                          .rank_join_timeout = absl::GetFlag(FLAGS_rank_join_timeout),
                          .phase_timeout = absl::GetFlag(FLAGS_rank_phase_timeout),
                          .rank_failure_retries = absl::GetFlag(FLAGS_rank_failure_retries),
                          .expert_link_bytes_per_second =
                              absl::GetFlag(FLAGS_expert_link_gbps) * 1e9 / 8},
             .dependencies = {.ucx = MaybeUcx(), .roster = roster, .rendezvous = rendezvous}};
         if (const int rank = absl::GetFlag(FLAGS_rank); rank > 0) {
           return JoinRankZero(rank, environment);
         }
         auto jobs = tandem::trainer::JobManager::Open(
             absl::GetFlag(FLAGS_data_dir),
             [environment](const tandem::trainer::v1::Job& job,
                           const tandem::trainer::JobProgress& progress,
                           const std::atomic<bool>& cancelled) {
               return tandem::trainer::RunJob(job, environment, progress, cancelled);
             },
             {.trainer_ranks = absl::GetFlag(FLAGS_ranks),
              .router_replay = !endpoints->router_replay.empty(),
              .ended_job_series_grace = absl::GetFlag(FLAGS_ended_job_metrics_grace)});
         if (!jobs.ok()) return jobs.status();
         auto service = std::make_unique<tandem::trainer::JobServiceImpl>(*std::move(jobs));
         tandem::trainer::JobServiceImpl* raw = service.get();
         std::vector<tandem::HostedService> services;
         services.push_back({"tandem.trainer.v1.JobService", std::move(service), /*ready=*/nullptr,
                             [raw] { raw->Drain(); }});
         services.push_back({"tandem.internal.v1.TrainerRanksService",
                             std::make_unique<tandem::trainer::TrainerRanksServiceImpl>(
                                 *communicator_ids, *rendezvous, *roster)});
         return services;
       }});
}
