#ifndef TANDEM_SERVICES_TRAINER_JOB_MANAGER_H_
#define TANDEM_SERVICES_TRAINER_JOB_MANAGER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/trainer/api/job_store.h"
#include "services/trainer/api/trainer_metrics.h"
#include "services/trainer/job/job_run.h"
#include "tandem/trainer/v1/trainer.pb.h"

namespace tandem::trainer {

// Runs one job's remaining steps to its end (RunJob in the trainer; a fake in tests). Returns OK
// when the job is done, CANCELLED once `cancelled` is seen, or the error that stopped it.
using JobRunner = std::function<absl::Status(
    const trainer::v1::Job& job, const JobProgress& progress, const std::atomic<bool>& cancelled)>;

// What the trainer's deployment offers its jobs, and how it reports them.
struct TrainerDeployment {
  int trainer_ranks = 1;      // Jobs may ask for up to this many data-parallel ranks.
  bool router_replay = true;  // A router-replay is configured (--router_replay): R3 works.
  // How long an ended job's step series stay exported, so that scrapes (every 15-60 s) see its
  // last step; then they are removed (--ended_job_metrics_grace).
  absl::Duration ended_job_series_grace = absl::Minutes(2);
};

// The Job API's core, with no gRPC: job states, persistence (a JobStore under data_dir),
// subscriptions and the worker thread that runs jobs one at a time through `runner` (oldest
// first; jobs a restart found RUNNING resume first). Thread-safe. See trainer.proto for the rules
// of every call.
class JobManager {
 public:
  // Reads the jobs in data_dir (a cancel cut by a restart completes now) and starts the worker.
  static absl::StatusOr<std::unique_ptr<JobManager>> Open(const std::string& data_dir,
                                                          JobRunner runner,
                                                          TrainerDeployment deployment = {});
  // Stops the running job (it stays RUNNING on disk and resumes at the next Open) and the worker.
  ~JobManager();

  absl::StatusOr<trainer::v1::Job> Create(const trainer::v1::CreateJobRequest& request);
  absl::StatusOr<trainer::v1::Job> Get(const std::string& job_id) const;
  absl::StatusOr<trainer::v1::ListJobsResponse> List(
      const trainer::v1::ListJobsRequest& request) const;
  absl::StatusOr<trainer::v1::Job> Cancel(const std::string& job_id);

  // Called with every event of a job (from the thread that made it), until it unsubscribes.
  using Listener = std::function<void(const trainer::v1::WatchJobResponse&)>;
  // The snapshot is passed to `listener` first, under the same lock, so no event is missed.
  absl::StatusOr<int64_t> Subscribe(const std::string& job_id, Listener listener);
  void Unsubscribe(int64_t subscription);

 private:
  JobManager(std::string data_dir, JobRunner runner, TrainerDeployment deployment,
             std::unique_ptr<JobStore> store);
  absl::StatusOr<trainer::v1::JobSpec> Resolve(const trainer::v1::JobSpec& spec,
                                               const std::string& job_id) const;
  // A job stored by an earlier trainer that has yet to run or finish runs its spec as this one
  // resolves it (defaults it writes out, limits it checks): the stored spec is brought up to
  // date, or the job FAILS naming the rule it breaks.
  void ReresolveSpec(const trainer::v1::Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // A new job's output_dir is its own: no other job's, and absent or empty -- unless the spec
  // starts from the checkpoint there (initial_checkpoint_dir) and its owner, if known, has ended.
  // FAILED_PRECONDITION naming the directory and what holds it.
  absl::Status CheckOutputDirIsNew(const trainer::v1::JobSpec& spec) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  void WorkLoop();
  // The job to run next (RUNNING before QUEUED, then oldest), marked RUNNING; nullopt when
  // stopping.
  std::optional<trainer::v1::Job> StartNextJob();
  JobProgress ProgressOf(const std::string& job_id);
  void Finish(const std::string& job_id, const absl::Status& result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Applies `change` to the job, stamps update_time, persists it and tells its listeners
  // (nobody for WATCH_EVENT_TYPE_UNSPECIFIED: a change that is no event, e.g. a new version).
  // When the record cannot be persisted, the change is undone (a job that did not exist is
  // removed), nobody is told, and the error (naming the path) is returned.
  absl::Status Update(const std::string& job_id, trainer::v1::WatchEventType event,
                      const std::function<void(trainer::v1::Job&)>& change)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Logs `what` failed to be saved and waits a while (less if the manager stops).
  void PauseAfterSaveFailure(const std::string& what, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Update for changes no client waits on (the worker's progress): a failure is logged.
  void UpdateOrLog(const std::string& job_id, trainer::v1::WatchEventType event,
                   const std::function<void(trainer::v1::Job&)>& change)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  std::vector<trainer::v1::Job> AllJobs() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const std::string data_dir_;
  const TrainerDeployment deployment_;
  const JobRunner runner_;
  const std::unique_ptr<JobStore> store_;
  mutable absl::Mutex mutex_;
  std::map<std::string, trainer::v1::Job> jobs_ ABSL_GUARDED_BY(mutex_);
  absl::flat_hash_map<std::string, std::string> by_request_id_ ABSL_GUARDED_BY(mutex_);
  struct Subscription {
    std::string job_id;
    Listener listener;
  };
  std::map<int64_t, Subscription> subscriptions_ ABSL_GUARDED_BY(mutex_);
  int64_t next_subscription_ ABSL_GUARDED_BY(mutex_) = 1;
  std::atomic<bool> cancel_running_{false};
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  EndedJobSeriesSweeper ended_job_series_;
  std::thread worker_;
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_JOB_MANAGER_H_
