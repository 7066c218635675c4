#ifndef TANDEM_SERVICES_TRAINER_JOB_SERVICE_H_
#define TANDEM_SERVICES_TRAINER_JOB_SERVICE_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "services/trainer/job_run.h"
#include "services/trainer/job_store.h"
#include "tandem/v1/trainer.grpc.pb.h"

namespace tandem::trainer {

struct TrainerOptions {
  std::string data_dir;  // Job records and default checkpoint directories.
  JobEnvironment environment;
};

// The Job API. Jobs persist in a JobStore; one worker thread runs them one at a time (oldest
// first; jobs a restart found RUNNING resume first, from their checkpoints).
class JobServiceImpl final : public v1::JobService::CallbackService {
 public:
  static absl::StatusOr<std::unique_ptr<JobServiceImpl>> Create(TrainerOptions options);
  ~JobServiceImpl() override;  // Cancels the running job and waits for it to stop.

  grpc::ServerUnaryReactor* CreateJob(grpc::CallbackServerContext* context,
                                      const v1::CreateJobRequest* request,
                                      v1::CreateJobResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest* request,
                                   v1::GetJobResponse* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const v1::CancelJobRequest* request,
                                      v1::CancelJobResponse* response) override;
  grpc::ServerWriteReactor<v1::WatchJobResponse>* WatchJob(
      grpc::CallbackServerContext* context, const v1::WatchJobRequest* request) override;

  // Called with every event of a job (from the thread that made it), until it unsubscribes.
  using Listener = std::function<void(const v1::WatchJobResponse&)>;
  // The snapshot is passed to `listener` first, under the same lock, so no event is missed.
  absl::StatusOr<int64_t> Subscribe(const std::string& job_id, Listener listener);
  void Unsubscribe(int64_t subscription);

 private:
  explicit JobServiceImpl(TrainerOptions options);

  absl::StatusOr<v1::Job> Create(const v1::CreateJobRequest& request);
  absl::StatusOr<v1::Job> Get(const std::string& job_id) const;
  absl::StatusOr<v1::ListJobsResponse> List(const v1::ListJobsRequest& request) const;
  absl::StatusOr<v1::Job> Cancel(const std::string& job_id);

  void WorkLoop();
  // Applies `change` to the job, stamps update_time, persists it and tells its listeners
  // (nobody for WATCH_EVENT_TYPE_UNSPECIFIED: a change that is no event, e.g. a new version).
  void Update(const std::string& job_id, v1::WatchEventType event,
              const std::function<void(v1::Job&)>& change) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  std::vector<v1::Job> AllJobs() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const TrainerOptions options_;
  std::unique_ptr<JobStore> store_;
  mutable absl::Mutex mutex_;
  std::map<std::string, v1::Job> jobs_ ABSL_GUARDED_BY(mutex_);
  absl::flat_hash_map<std::string, std::string> by_request_id_ ABSL_GUARDED_BY(mutex_);
  struct Subscription {
    std::string job_id;
    Listener listener;
  };
  std::map<int64_t, Subscription> subscriptions_ ABSL_GUARDED_BY(mutex_);
  int64_t next_subscription_ ABSL_GUARDED_BY(mutex_) = 1;
  std::atomic<bool> cancel_running_{false};
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread worker_;
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_JOB_SERVICE_H_
