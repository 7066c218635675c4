#include "services/trainer/api/job_service.h"

#include <deque>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "common/finished_reactor.h"
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

// The job a Get, Cancel or Watch request names: by job_id, or by its resource name
// "jobs/{id}", exactly one of them (both may be set if they name the same job).
template <typename Request>
absl::StatusOr<std::string> NamedJobId(const Request& request) {
  if (request.name().empty()) {
    if (request.job_id().empty()) return InvalidField("job_id", "job_id or name is required");
    return request.job_id();
  }
  absl::string_view id = request.name();
  if (!absl::ConsumePrefix(&id, "jobs/") || id.empty() || absl::StrContains(id, '/')) {
    return InvalidField("name", "name must be jobs/{job_id}");
  }
  if (!request.job_id().empty() && request.job_id() != id) {
    return InvalidField("name", "name and job_id name different jobs; set one of them");
  }
  return std::string(id);
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
  absl::StatusOr<std::string> id = NamedJobId(*request);
  if (!id.ok())
    return FinishUnary(context, absl::StatusOr<trainer::v1::Job>(id.status()), response);
  return FinishUnary(context, jobs_->Get(*id), response);
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(grpc::CallbackServerContext* context,
                                                   const trainer::v1::ListJobsRequest* request,
                                                   trainer::v1::ListJobsResponse* response) {
  return FinishUnary(context, jobs_->List(*request), response);
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(grpc::CallbackServerContext* context,
                                                    const trainer::v1::CancelJobRequest* request,
                                                    trainer::v1::Job* response) {
  absl::StatusOr<std::string> id = NamedJobId(*request);
  if (!id.ok())
    return FinishUnary(context, absl::StatusOr<trainer::v1::Job>(id.status()), response);
  return FinishUnary(context, jobs_->Cancel(*id), response);
}

grpc::ServerWriteReactor<trainer::v1::WatchJobResponse>* JobServiceImpl::WatchJob(
    grpc::CallbackServerContext* /*context*/, const trainer::v1::WatchJobRequest* request) {
  absl::StatusOr<std::string> id = NamedJobId(*request);
  if (!id.ok()) {
    return new FinishedReactor<grpc::ServerWriteReactor<trainer::v1::WatchJobResponse>>(
        ToGrpcStatus(id.status()));
  }
  return new WatchReactor(*jobs_, watches_, *id);
}

}  // namespace tandem::trainer
