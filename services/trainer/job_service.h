#ifndef TANDEM_SERVICES_TRAINER_JOB_SERVICE_H_
#define TANDEM_SERVICES_TRAINER_JOB_SERVICE_H_

#include "common/unimplemented.h"
#include "tandem/v1/trainer.grpc.pb.h"

namespace tandem::trainer {

// gRPC adapter of the trainer service. Job API: create, list, watch and cancel RL jobs; runs them
// (issue #7). Until then every RPC answers UNIMPLEMENTED naming itself.
class JobServiceImpl final : public v1::JobService::CallbackService {
 public:
  grpc::ServerUnaryReactor* CreateJob(grpc::CallbackServerContext* context,
                                      const v1::CreateJobRequest* /*request*/,
                                      v1::CreateJobResponse* /*response*/) override {
    return FinishUnimplemented(context, "tandem.v1.JobService/CreateJob");
  }

  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest* /*request*/,
                                   v1::GetJobResponse* /*response*/) override {
    return FinishUnimplemented(context, "tandem.v1.JobService/GetJob");
  }

  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest* /*request*/,
                                     v1::ListJobsResponse* /*response*/) override {
    return FinishUnimplemented(context, "tandem.v1.JobService/ListJobs");
  }

  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const v1::CancelJobRequest* /*request*/,
                                      v1::CancelJobResponse* /*response*/) override {
    return FinishUnimplemented(context, "tandem.v1.JobService/CancelJob");
  }

  grpc::ServerWriteReactor<v1::WatchJobResponse>* WatchJob(
      grpc::CallbackServerContext* /*context*/, const v1::WatchJobRequest* /*request*/) override {
    return FinishStreamUnimplemented<grpc::ServerWriteReactor<v1::WatchJobResponse>>(
        "tandem.v1.JobService/WatchJob");
  }
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_JOB_SERVICE_H_
