#ifndef TANDEM_SERVICES_TRAINER_JOB_SERVICE_H_
#define TANDEM_SERVICES_TRAINER_JOB_SERVICE_H_

#include <memory>

#include "common/open_streams.h"
#include "services/trainer/api/job_manager.h"
#include "tandem/trainer/v1/trainer.grpc.pb.h"

namespace tandem::trainer {

// The Job API's gRPC front end: each call goes to the JobManager it owns, and WatchJob streams
// a subscription.
class JobServiceImpl final : public trainer::v1::JobService::CallbackService {
 public:
  explicit JobServiceImpl(std::unique_ptr<JobManager> jobs) : jobs_(std::move(jobs)) {}

  grpc::ServerUnaryReactor* CreateJob(grpc::CallbackServerContext* context,
                                      const trainer::v1::CreateJobRequest* request,
                                      trainer::v1::Job* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const trainer::v1::GetJobRequest* request,
                                   trainer::v1::Job* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const trainer::v1::ListJobsRequest* request,
                                     trainer::v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const trainer::v1::CancelJobRequest* request,
                                      trainer::v1::Job* response) override;
  // For a server drain: ends every WatchJob stream with UNAVAILABLE (watch again).
  void Drain() { watches_.EndAll(DrainingStatus("trainer")); }

  grpc::ServerWriteReactor<trainer::v1::WatchJobResponse>* WatchJob(
      grpc::CallbackServerContext* context, const trainer::v1::WatchJobRequest* request) override;

 private:
  const std::unique_ptr<JobManager> jobs_;
  OpenStreams<trainer::v1::WatchJobResponse> watches_;
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_JOB_SERVICE_H_
