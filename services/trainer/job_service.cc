#include "services/trainer/job_service.h"

#include <deque>

#include "common/open_streams.h"
#include "common/queued_write_reactor.h"
#include "common/status.h"
#include "common/unary.h"

namespace tandem::trainer {
namespace {

bool IsTerminal(trainer::v1::JobState state) {
  return state == trainer::v1::JOB_STATE_SUCCEEDED || state == trainer::v1::JOB_STATE_FAILED ||
         state == trainer::v1::JOB_STATE_CANCELLED;
}

// Streams a job's snapshot and events, ending OK after a terminal state. A step event waiting
// behind another one replaces it; state changes are never dropped.
class WatchReactor final : public QueuedWriteReactor<trainer::v1::WatchJobResponse> {
 public:
  WatchReactor(JobManager& jobs, OpenStreams<trainer::v1::WatchJobResponse>& open,
               const std::string& job_id)
      : jobs_(jobs), open_(open) {
    auto subscription = jobs_.Subscribe(
        job_id,
        [sink = sink()](const trainer::v1::WatchJobResponse& event) { sink->Write(event); });
    if (!subscription.ok()) {
      sink()->Finish(ToGrpcStatus(subscription.status()));
      return;
    }
    subscription_ = *subscription;
    open_id_ = open_.Add(sink());
  }

 private:
  void Enqueue(std::deque<trainer::v1::WatchJobResponse>& queue,
               trainer::v1::WatchJobResponse event) override {
    if (terminal_queued_) return;
    terminal_queued_ = IsTerminal(event.job().state());
    if (event.type() == trainer::v1::WATCH_EVENT_TYPE_STEP_COMPLETED && !queue.empty() &&
        queue.back().type() == trainer::v1::WATCH_EVENT_TYPE_STEP_COMPLETED) {
      queue.back() = std::move(event);
    } else {
      queue.push_back(std::move(event));
    }
  }

  bool IsLast(const trainer::v1::WatchJobResponse& event) override {
    return IsTerminal(event.job().state());
  }

  void OnClientGone() override {
    if (subscription_ != 0) jobs_.Unsubscribe(subscription_);
    open_.Remove(open_id_);
  }

  JobManager& jobs_;
  OpenStreams<trainer::v1::WatchJobResponse>& open_;
  int64_t open_id_ = 0;
  int64_t subscription_ = 0;
  bool terminal_queued_ = false;
};

}  // namespace

grpc::ServerUnaryReactor* JobServiceImpl::CreateJob(grpc::CallbackServerContext* context,
                                                    const trainer::v1::CreateJobRequest* request,
                                                    trainer::v1::Job* response) {
  return FinishUnary(context, jobs_->Create(*request), response);
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(grpc::CallbackServerContext* context,
                                                 const trainer::v1::GetJobRequest* request,
                                                 trainer::v1::Job* response) {
  return FinishUnary(context, jobs_->Get(request->job_id()), response);
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(grpc::CallbackServerContext* context,
                                                   const trainer::v1::ListJobsRequest* request,
                                                   trainer::v1::ListJobsResponse* response) {
  return FinishUnary(context, jobs_->List(*request), response);
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(grpc::CallbackServerContext* context,
                                                    const trainer::v1::CancelJobRequest* request,
                                                    trainer::v1::Job* response) {
  return FinishUnary(context, jobs_->Cancel(request->job_id()), response);
}

grpc::ServerWriteReactor<trainer::v1::WatchJobResponse>* JobServiceImpl::WatchJob(
    grpc::CallbackServerContext* /*context*/, const trainer::v1::WatchJobRequest* request) {
  return new WatchReactor(*jobs_, watches_, request->job_id());
}

}  // namespace tandem::trainer
