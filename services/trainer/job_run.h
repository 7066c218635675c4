#ifndef TANDEM_SERVICES_TRAINER_JOB_RUN_H_
#define TANDEM_SERVICES_TRAINER_JOB_RUN_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "transfer/ucx_transport.h"
#include "tandem/v1/trainer.pb.h"

namespace tandem::trainer {

// What a job run needs from the trainer process.
struct JobEnvironment {
  std::string auth_token;  // Sent to the other services.
  transfer::UcxWorker* ucx = nullptr;  // Publishes by UCX when set.
  absl::Duration rpc_timeout = absl::Minutes(5);
  absl::Duration swap_timeout = absl::Seconds(60);
  // While a replica has not swapped a published version in yet, it is asked again after
  // swap_poll_initial, then twice as long each time up to swap_poll_max: a local swap takes
  // milliseconds, a remote one over a slow link seconds, and neither wants a 2 ms RPC loop.
  absl::Duration swap_poll_initial = absl::Milliseconds(1);
  absl::Duration swap_poll_max = absl::Milliseconds(50);
  // Generation of a step is retried while a rollout replica is UNAVAILABLE (restarting,
  // unreachable), this many times in all, waiting retry_backoff, then twice as long, ...
  int generate_attempts = 6;
  absl::Duration retry_backoff = absl::Milliseconds(500);
};

// Called from the run's thread.
struct JobProgress {
  std::function<void(int64_t policy_version)> on_published;
  std::function<void(const v1::StepMetrics&)> on_step;
};

// Runs the remaining steps of `job` (spec resolved): resumes from the checkpoint in its output
// directory if there is one, publishes the starting adapter as a new version, then per step asks
// the rollout replicas for samples with the current version, scores them with the verifier,
// fetches their routes from router-replay, updates the LoRA (PolicyUpdater), publishes the new
// version and waits until every replica serves it. Returns OK after the last step, CANCELLED
// once `cancelled` is seen (between phases), or the error that stopped it.
absl::Status RunJob(const v1::Job& job, const JobEnvironment& environment,
                    const JobProgress& progress, const std::atomic<bool>& cancelled);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_JOB_RUN_H_
