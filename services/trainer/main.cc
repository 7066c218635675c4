#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/peer_tls.h"
#include "common/service_main.h"
#include "engine/blas_threads_flag.h"
#include "engine/cuda/device_engines.h"
#include "services/trainer/communicator_ids.h"
#include "services/trainer/job_service.h"
#include "services/trainer/service_endpoints.h"
#include "services/trainer/trainer_ranks_service.h"

ABSL_FLAG(std::string, data_dir, "trainer-data",
          "Job records and, by default, each job's checkpoint directory (<data_dir>/<job id>).");
ABSL_FLAG(bool, ucx, true, "Publish adapters to weight-store by UCX put when it serves UCX.");
ABSL_FLAG(std::string, ucx_transports, "", "UCX transports (as UCX_TLS); empty: UCX's choice.");
ABSL_FLAG(absl::Duration, store_outage_budget, absl::Seconds(60),
          "How long a running job waits out an unavailable weight-store or router-replay "
          "(restarting, full disk) before it fails.");
// Defaults for jobs whose spec leaves endpoints empty (trainer.proto's ServiceEndpoints).
ABSL_FLAG(
    std::vector<std::string>, rollout, {},
    "Default rollout replicas (comma-separated addresses); exclusive with --rollout_service.");
ABSL_FLAG(std::string, rollout_service, "",
          "Default rollout replicas as a headless Service name:port: every address the name "
          "resolves to is a replica, looked up whenever a job starts or resumes.");
ABSL_FLAG(std::string, weight_store, "", "Default weight-store address.");
ABSL_FLAG(std::string, router_replay, "", "Default router-replay address.");
ABSL_FLAG(std::string, device, "cpu",
          "Where jobs train: cpu, or cuda / cuda:N (a GPU; fp32, standard attention).");

namespace {

absl::StatusOr<tandem::v1::ServiceEndpoints> DefaultEndpointsFromFlags() {
  tandem::v1::ServiceEndpoints defaults;
  for (const std::string& address : absl::GetFlag(FLAGS_rollout)) defaults.add_rollout(address);
  defaults.set_rollout_service(absl::GetFlag(FLAGS_rollout_service));
  defaults.set_weight_store(absl::GetFlag(FLAGS_weight_store));
  defaults.set_router_replay(absl::GetFlag(FLAGS_router_replay));
  if (!defaults.rollout().empty() && !defaults.rollout_service().empty()) {
    return absl::InvalidArgumentError("--rollout and --rollout_service are exclusive; set one");
  }
  if (!defaults.rollout_service().empty()) {
    if (absl::Status status = tandem::trainer::CheckServiceName(defaults.rollout_service());
        !status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--rollout_service: ", status.message()));
    }
  }
  return defaults;
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
           return absl::InvalidArgumentError("--store_outage_budget must be >= 0");
         }
         // A bad --device fails at startup, not in the first job.
         const std::string device = absl::GetFlag(FLAGS_device);
         absl::StatusOr<std::string> described = tandem::engine::DescribeDevice(device);
         if (!described.ok()) {
           return absl::Status(
               described.status().code(),
               absl::StrCat("--device=", device, ": ", described.status().message()));
         }
         spdlog::info("jobs train on {}", *described);
         const tandem::trainer::JobEnvironment environment = {.auth_token = server.auth_token,
                                                              .tls = *std::move(peer_tls),
                                                              .ucx = MaybeUcx(),
                                                              .device = device,
                                                              .store_outage_budget = outage_budget};
         auto default_endpoints = DefaultEndpointsFromFlags();
         if (!default_endpoints.ok()) return default_endpoints.status();
         auto jobs = tandem::trainer::JobManager::Open(
             absl::GetFlag(FLAGS_data_dir),
             [environment](const tandem::v1::Job& job, const tandem::trainer::JobProgress& progress,
                           const std::atomic<bool>& cancelled) {
               return tandem::trainer::RunJob(job, environment, progress, cancelled);
             },
             *default_endpoints);
         if (!jobs.ok()) return jobs.status();
         auto service = std::make_unique<tandem::trainer::JobServiceImpl>(*std::move(jobs));
         tandem::trainer::JobServiceImpl* raw = service.get();
         std::vector<tandem::HostedService> services;
         services.push_back({"tandem.v1.JobService", std::move(service), /*ready=*/nullptr,
                             [raw] { raw->Drain(); }});
         // The communicator ids and rendezvous values of the groups this trainer leads as rank
         // 0, for their other ranks (groups are formed by multi-rank jobs).
         static auto* communicator_ids = new tandem::trainer::CommunicatorIds();
         static auto* rendezvous = new tandem::trainer::RendezvousValues();
         services.push_back({"tandem.v1.TrainerRanksService",
                             std::make_unique<tandem::trainer::TrainerRanksServiceImpl>(
                                 *communicator_ids, *rendezvous)});
         return services;
       }});
}
