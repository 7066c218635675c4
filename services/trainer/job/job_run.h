#ifndef TANDEM_SERVICES_TRAINER_JOB_RUN_H_
#define TANDEM_SERVICES_TRAINER_JOB_RUN_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/gloo_communicator.h"
#include "gloo/rendezvous/store.h"
#include "services/trainer/job/service_dialer.h"
#include "services/trainer/job/service_endpoints.h"
#include "services/trainer/ranks/rank_roster.h"
#include "services/trainer/ranks/rendezvous_values.h"
#include "tandem/internal/v1/trainer_ranks.pb.h"
#include "tandem/trainer/v1/trainer.pb.h"
#include "transfer/ucx_transport.h"

namespace tandem::trainer {

// How the trainer runs jobs: its settings, plain values (from its flags).
struct JobSettings {
  ServiceEndpoints services;     // Where the job's rollout replicas and stores run.
  std::string auth_token;        // Sent to the other services when no dialer is injected,
  std::string auth_token_file;   // or the token in this file, read again when it changes.
  std::optional<ClientTls> tls;  // How they are dialed then; unset: plaintext.
  // Where jobs train: "cpu", or "cuda" / "cuda:N" (engine::MakeTrainingEngines).
  std::string device = "cpu";
  absl::Duration rpc_timeout = absl::Minutes(5);
  absl::Duration swap_timeout = absl::Seconds(60);
  // Each replica tells when it swapped a published version in (WatchAdapterStatus); one that
  // predates the watch is asked again after swap_poll_initial, then twice as long each time up
  // to swap_poll_max (rollout::VersionSwapOptions).
  absl::Duration swap_poll_initial = absl::Milliseconds(1);
  absl::Duration swap_poll_max = absl::Milliseconds(50);
  // Generation of a step is retried while a rollout replica is UNAVAILABLE (restarting,
  // unreachable), this many times in all, waiting retry_backoff, then twice as long, ...
  int generate_attempts = 6;
  absl::Duration retry_backoff = absl::Milliseconds(500);
  // A store (weight-store, router-replay) that is UNAVAILABLE (restarting) or RESOURCE_EXHAUSTED
  // (full disk, too busy) is retried with the same doubling backoff (capped at 5 s) until it has
  // been unavailable this long; only then does the job fail, naming the store and the time.
  absl::Duration store_outage_budget = absl::Seconds(60);
  // This rank's address for its Gloo peers, and the bound on joining a group and on every
  // collective (a dead or stuck rank fails the step within it).
  GlooOptions gloo;
  // How long a multi-rank job waits for its ranks to join (and load the model) before it fails
  // naming them.
  absl::Duration rank_join_timeout = absl::Minutes(2);
  // How long a multi-rank job's ranks wait for each other between a step's phases, where one may
  // still be generating or riding out a store outage (collectives within a phase are bounded by
  // gloo.timeout).
  absl::Duration phase_timeout = absl::Minutes(15);
  // A multi-rank job whose group broke (a rank died or stalled) goes on from its last checkpoint
  // as a new attempt in a new group, this many times, after rank_retry_delay (time for the
  // surviving ranks to leave the old group); then it fails.
  int rank_failure_retries = 3;
  absl::Duration rank_retry_delay = absl::Seconds(2);
  // The link rate between expert-parallel ranks, which prices expert moves and replicas
  // (placement::BalanceCosts); 0: unknown.
  double expert_link_bytes_per_second = 0;
};

// What a job's runs use that the trainer process owns and injects (none owned by a run).
struct JobDependencies {
  ServiceDialer* dialer = nullptr;     // Not owned; null: GrpcServiceDialer(auth_token, tls).
  transfer::UcxWorker* ucx = nullptr;  // Publishes by UCX when set.
  // Where a multi-rank job's ranks meet, in the trainer that serves the Job API (rank 0): the
  // deployment's other ranks, and the rendezvous values they form Gloo groups through. Null in a
  // deployment of one rank, where a job on more ranks fails.
  RankRoster* roster = nullptr;
  RendezvousValues* rendezvous = nullptr;
};

// What a job run needs from the trainer process: its settings, apart from the objects it injects.
struct JobEnvironment {
  JobSettings settings;
  JobDependencies dependencies;
};

// Called from the run's thread.
struct JobProgress {
  // Once per run, before its first step: the run continues after `start_step` (its checkpoint's
  // step, or 0).
  std::function<void(int64_t start_step)> on_attempt_start;
  std::function<void(int64_t policy_version)> on_published;
  std::function<void(const trainer::v1::StepMetrics&)> on_step;
  // What the run waits for while it cannot go on (trainer ranks to join); "" once it goes on.
  // Optional.
  std::function<void(const std::string& status)> on_status;
};

// Runs the remaining steps of `job` (spec resolved): resumes from the checkpoint in its output
// directory if there is one, publishes the starting adapter as a new version, then per step asks
// the rollout replicas for samples with the current version, scores them with the verifier,
// fetches their routes from router-replay, updates the LoRA (PolicyUpdater), publishes the new
// version and waits until every replica serves it. Returns OK after the last step, CANCELLED
// once `cancelled` is seen (between phases), or the error that stopped it.
// A job of several data-parallel ranks (spec.parallelism) runs on this rank as its rank 0: it
// posts the job to the deployment's ranks 1..N-1 (environment.roster), waits for them to join,
// forms their Gloo group, sends them its starting state, and leads every step (see
// trainer.proto's Parallelism).
absl::Status RunJob(const trainer::v1::Job& job, const JobEnvironment& environment,
                    const JobProgress& progress, const std::atomic<bool>& cancelled);

// Runs this trainer's part of a multi-rank job as data-parallel rank
// assignment.data_parallel_rank() > 0, as rank 0 posted it: joins the run's Gloo group through
// `store` (rank 0's rendezvous values), takes its starting state from rank 0, then generates,
// trains and publishes its share of every step in lockstep with the others. Progress and
// checkpoints are rank 0's. Returns OK after the last step, or the error that stopped it.
absl::Status RunJobRank(const internal::v1::GetAssignmentResponse& assignment,
                        gloo::rendezvous::Store& store, const JobEnvironment& environment,
                        const std::atomic<bool>& cancelled);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_JOB_RUN_H_
