#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "common/logging.h"
#include "common/peer_tls.h"
#include "common/service_main.h"
#include "services/trainer/job_service.h"

ABSL_FLAG(std::string, data_dir, "trainer-data",
          "Job records and, by default, each job's checkpoint directory (<data_dir>/<job id>).");
ABSL_FLAG(bool, ucx, true, "Publish adapters to weight-store by UCX put when it serves UCX.");
ABSL_FLAG(std::string, ucx_transports, "", "UCX transports (as UCX_TLS); empty: UCX's choice.");
ABSL_FLAG(absl::Duration, store_outage_budget, absl::Seconds(60),
          "How long a running job waits out an unavailable weight-store or router-replay "
          "(restarting, full disk) before it fails.");

namespace {

// The trainer's UCX worker lives as long as the process.
tandem::transfer::UcxWorker* MaybeUcx() {
  if (!absl::GetFlag(FLAGS_ucx)) return nullptr;
  static auto* worker = [] {
    auto created = tandem::transfer::UcxWorker::Create(
        {.transports = absl::GetFlag(FLAGS_ucx_transports)});
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
         auto peer_tls = tandem::PeerTlsFromFlags();
         if (!peer_tls.ok()) return peer_tls.status();
         const absl::Duration outage_budget = absl::GetFlag(FLAGS_store_outage_budget);
         if (outage_budget < absl::ZeroDuration()) {
           return absl::InvalidArgumentError("--store_outage_budget must be >= 0");
         }
         const tandem::trainer::JobEnvironment environment = {.auth_token = server.auth_token,
                                                              .tls = *std::move(peer_tls),
                                                              .ucx = MaybeUcx(),
                                                              .store_outage_budget = outage_budget};
         auto jobs = tandem::trainer::JobManager::Open(
             absl::GetFlag(FLAGS_data_dir),
             [environment](const tandem::v1::Job& job, const tandem::trainer::JobProgress& progress,
                           const std::atomic<bool>& cancelled) {
               return tandem::trainer::RunJob(job, environment, progress, cancelled);
             });
         if (!jobs.ok()) return jobs.status();
         auto service = std::make_unique<tandem::trainer::JobServiceImpl>(*std::move(jobs));
         tandem::trainer::JobServiceImpl* raw = service.get();
         std::vector<tandem::HostedService> services;
         services.push_back(
             {"tandem.v1.JobService", std::move(service), /*ready=*/nullptr, [raw] { raw->Drain(); }});
         return services;
       }});
}
