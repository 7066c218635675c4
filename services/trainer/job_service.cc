#include "services/trainer/job_service.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "common/queued_write_reactor.h"
#include "common/status.h"
#include "common/unary.h"
#include "google/protobuf/util/message_differencer.h"
#include "google/protobuf/util/time_util.h"
#include "services/trainer/job_spec.h"
#include "services/trainer/trainer_metrics.h"

namespace tandem::trainer {
namespace {

using ::google::protobuf::util::TimeUtil;

constexpr int kDefaultPageSize = 50;
constexpr int kMaxPageSize = 1000;

google::protobuf::Timestamp Now() {
  return TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(absl::Now()));
}

std::string NewJobId() {
  std::random_device random;
  return absl::StrFormat("job-%06x%06x", random() & 0xffffff, random() & 0xffffff);
}

absl::Status RequireJobId(const std::string& job_id) {
  return job_id.empty() ? absl::InvalidArgumentError("job_id is required") : absl::OkStatus();
}

bool IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

// A page token names the offset and the filter it belongs to: "<offset>/<states>".
std::string FilterKey(const v1::ListJobsRequest& request) {
  std::vector<int> states(request.states().begin(), request.states().end());
  std::sort(states.begin(), states.end());
  return absl::StrJoin(states, ",");
}

// Streams a job's snapshot and events, ending OK after a terminal state. A step event waiting
// behind another one replaces it; state changes are never dropped.
class WatchReactor final : public QueuedWriteReactor<v1::WatchJobResponse> {
 public:
  WatchReactor(JobServiceImpl& service, const std::string& job_id) : service_(service) {
    auto subscription = service_.Subscribe(
        job_id, [sink = sink()](const v1::WatchJobResponse& event) { sink->Write(event); });
    if (!subscription.ok()) {
      sink()->Finish(ToGrpcStatus(subscription.status()));
      return;
    }
    subscription_ = *subscription;
  }

 private:
  void Enqueue(std::deque<v1::WatchJobResponse>& queue, v1::WatchJobResponse event) override {
    if (terminal_queued_) return;
    terminal_queued_ = IsTerminal(event.job().state());
    if (event.type() == v1::WATCH_EVENT_TYPE_STEP_COMPLETED && !queue.empty() &&
        queue.back().type() == v1::WATCH_EVENT_TYPE_STEP_COMPLETED) {
      queue.back() = std::move(event);
    } else {
      queue.push_back(std::move(event));
    }
  }

  bool IsLast(const v1::WatchJobResponse& event) override {
    return IsTerminal(event.job().state());
  }

  void OnClientGone() override {
    if (subscription_ != 0) service_.Unsubscribe(subscription_);
  }

  JobServiceImpl& service_;
  int64_t subscription_ = 0;
  bool terminal_queued_ = false;
};

// Finishes an RPC whose response is just the job.
template <typename Response>
grpc::ServerUnaryReactor* FinishWithJob(grpc::CallbackServerContext* context,
                                        absl::StatusOr<v1::Job> job, Response* response) {
  if (!job.ok()) return FinishUnary<Response>(context, job.status(), response);
  Response result;
  *result.mutable_job() = *std::move(job);
  return FinishUnary<Response>(context, std::move(result), response);
}

}  // namespace

JobServiceImpl::JobServiceImpl(TrainerOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<JobServiceImpl>> JobServiceImpl::Create(TrainerOptions options) {
  std::unique_ptr<JobServiceImpl> service(new JobServiceImpl(std::move(options)));
  auto store = JobStore::Open(service->options_.data_dir);
  if (!store.ok()) return store.status();
  service->store_ = *std::move(store);
  {
    absl::MutexLock lock(&service->mutex_);
    for (const v1::Job& job : service->store_->loaded()) {
      service->jobs_[job.id()] = job;
      service->by_request_id_[job.request_id()] = job.id();
      // A cancel that was in progress when the trainer stopped is complete now.
      if (job.state() == v1::JOB_STATE_CANCELLING) {
        service->Update(job.id(), v1::WATCH_EVENT_TYPE_STATE_CHANGED, [](v1::Job& j) {
          j.set_state(v1::JOB_STATE_CANCELLED);
          *j.mutable_end_time() = Now();
        });
      }
    }
    RecordJobCounts(service->AllJobs());
  }
  service->worker_ = std::thread([raw = service.get()] { raw->WorkLoop(); });
  return service;
}

JobServiceImpl::~JobServiceImpl() {
  {
    absl::MutexLock lock(&mutex_);
    stopping_ = true;
  }
  cancel_running_ = true;  // The run stops; its job stays RUNNING on disk and resumes later.
  worker_.join();
}

std::vector<v1::Job> JobServiceImpl::AllJobs() const {
  std::vector<v1::Job> jobs;
  for (const auto& [id, job] : jobs_) jobs.push_back(job);
  return jobs;
}

void JobServiceImpl::Update(const std::string& job_id, v1::WatchEventType event,
                            const std::function<void(v1::Job&)>& change) {
  v1::Job& job = jobs_[job_id];
  change(job);
  *job.mutable_update_time() = Now();
  if (absl::Status status = store_->Put(job); !status.ok()) {
    spdlog::error("cannot persist job {}: {}", job_id, status.ToString());
  }
  if (event == v1::WATCH_EVENT_TYPE_UNSPECIFIED) return;
  v1::WatchJobResponse response;
  response.set_type(event);
  *response.mutable_job() = job;
  for (auto& [id, subscription] : subscriptions_) {
    if (subscription.job_id == job_id) subscription.listener(response);
  }
  if (event == v1::WATCH_EVENT_TYPE_STATE_CHANGED) RecordJobCounts(AllJobs());
}

absl::StatusOr<int64_t> JobServiceImpl::Subscribe(const std::string& job_id, Listener listener) {
  if (absl::Status status = RequireJobId(job_id); !status.ok()) return status;
  absl::MutexLock lock(&mutex_);
  auto found = jobs_.find(job_id);
  if (found == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  v1::WatchJobResponse snapshot;
  snapshot.set_type(v1::WATCH_EVENT_TYPE_SNAPSHOT);
  *snapshot.mutable_job() = found->second;
  listener(snapshot);
  const int64_t id = next_subscription_++;
  subscriptions_[id] = {job_id, std::move(listener)};
  return id;
}

void JobServiceImpl::Unsubscribe(int64_t subscription) {
  absl::MutexLock lock(&mutex_);
  subscriptions_.erase(subscription);
}

absl::StatusOr<v1::Job> JobServiceImpl::Create(const v1::CreateJobRequest& request) {
  if (request.request_id().empty() || request.request_id().size() > 256) {
    return absl::InvalidArgumentError("request_id must have 1..256 bytes");
  }
  absl::MutexLock lock(&mutex_);
  if (auto existing = by_request_id_.find(request.request_id()); existing != by_request_id_.end()) {
    const v1::Job& job = jobs_[existing->second];
    auto resolved = ResolveJobSpec(request.spec(), job.id(),
                                   absl::StrCat(options_.data_dir, "/", job.id()));
    if (resolved.ok() &&
        google::protobuf::util::MessageDifferencer::Equals(*resolved, job.spec())) {
      return job;
    }
    return absl::AlreadyExistsError(absl::StrCat("request_id ", request.request_id(),
                                                 " already created job ", job.id(),
                                                 " with a different spec"));
  }
  const std::string id = NewJobId();
  auto spec = ResolveJobSpec(request.spec(), id, absl::StrCat(options_.data_dir, "/", id));
  if (!spec.ok()) return spec.status();
  by_request_id_[request.request_id()] = id;
  Update(id, v1::WATCH_EVENT_TYPE_STATE_CHANGED, [&](v1::Job& job) {
    job.set_id(id);
    *job.mutable_spec() = *std::move(spec);
    job.set_state(v1::JOB_STATE_QUEUED);
    job.set_request_id(request.request_id());
    *job.mutable_create_time() = Now();
  });
  spdlog::info("job {} queued ({} steps)", id, jobs_[id].spec().num_steps());
  return jobs_[id];
}

absl::StatusOr<v1::Job> JobServiceImpl::Get(const std::string& job_id) const {
  if (absl::Status status = RequireJobId(job_id); !status.ok()) return status;
  absl::MutexLock lock(&mutex_);
  auto found = jobs_.find(job_id);
  if (found == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  return found->second;
}

absl::StatusOr<v1::ListJobsResponse> JobServiceImpl::List(
    const v1::ListJobsRequest& request) const {
  if (request.page_size() < 0) return absl::InvalidArgumentError("page_size must be >= 0");
  for (int state : request.states()) {
    if (state == v1::JOB_STATE_UNSPECIFIED || !v1::JobState_IsValid(state)) {
      return absl::InvalidArgumentError(absl::StrCat("states: ", state, " is not a job state"));
    }
  }
  const int page_size = request.page_size() == 0 ? kDefaultPageSize
                                                 : std::min(request.page_size(), kMaxPageSize);
  int64_t offset = 0;
  if (!request.page_token().empty()) {
    const std::vector<std::string> parts = absl::StrSplit(request.page_token(), '/');
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &offset) || offset < 0 ||
        parts[1] != FilterKey(request)) {
      return absl::InvalidArgumentError("page_token is malformed or belongs to another filter");
    }
  }
  std::vector<v1::Job> jobs;
  {
    absl::MutexLock lock(&mutex_);
    for (const auto& [id, job] : jobs_) {
      if (request.states().empty() ||
          std::find(request.states().begin(), request.states().end(), job.state()) !=
              request.states().end()) {
        jobs.push_back(job);
      }
    }
  }
  std::sort(jobs.begin(), jobs.end(), [](const v1::Job& a, const v1::Job& b) {
    const int64_t ta = TimeUtil::TimestampToNanoseconds(a.create_time());
    const int64_t tb = TimeUtil::TimestampToNanoseconds(b.create_time());
    return ta != tb ? ta > tb : a.id() < b.id();
  });
  v1::ListJobsResponse response;
  for (int64_t i = offset; i < static_cast<int64_t>(jobs.size()) && i < offset + page_size; ++i) {
    *response.add_jobs() = jobs[i];
  }
  if (offset + page_size < static_cast<int64_t>(jobs.size())) {
    response.set_next_page_token(absl::StrCat(offset + page_size, "/", FilterKey(request)));
  }
  return response;
}

absl::StatusOr<v1::Job> JobServiceImpl::Cancel(const std::string& job_id) {
  if (absl::Status status = RequireJobId(job_id); !status.ok()) return status;
  absl::MutexLock lock(&mutex_);
  auto found = jobs_.find(job_id);
  if (found == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  switch (found->second.state()) {
    case v1::JOB_STATE_SUCCEEDED:
    case v1::JOB_STATE_FAILED:
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", job_id, " is already ", v1::JobState_Name(found->second.state()).substr(10)));
    case v1::JOB_STATE_QUEUED:
      Update(job_id, v1::WATCH_EVENT_TYPE_STATE_CHANGED, [](v1::Job& job) {
        job.set_state(v1::JOB_STATE_CANCELLED);
        *job.mutable_end_time() = Now();
      });
      break;
    case v1::JOB_STATE_RUNNING:
      Update(job_id, v1::WATCH_EVENT_TYPE_STATE_CHANGED,
             [](v1::Job& job) { job.set_state(v1::JOB_STATE_CANCELLING); });
      cancel_running_ = true;
      break;
    default:  // CANCELLING or CANCELLED: nothing to do.
      break;
  }
  return jobs_[job_id];
}

void JobServiceImpl::WorkLoop() {
  while (true) {
    std::optional<v1::Job> next;
    {
      absl::MutexLock lock(&mutex_);
      // Jobs found RUNNING at start resume first, then the oldest queued job.
      const auto runnable = [this]() {
        mutex_.AssertHeld();
        if (stopping_) return true;
        for (const auto& [id, job] : jobs_) {
          if (job.state() == v1::JOB_STATE_RUNNING || job.state() == v1::JOB_STATE_QUEUED) {
            return true;
          }
        }
        return false;
      };
      mutex_.Await(absl::Condition(&runnable));
      if (stopping_) return;
      for (const auto& [id, job] : jobs_) {
        const bool better =
            !next.has_value() ||
            (job.state() == v1::JOB_STATE_RUNNING && next->state() != v1::JOB_STATE_RUNNING) ||
            (job.state() == next->state() &&
             TimeUtil::TimestampToNanoseconds(job.create_time()) <
                 TimeUtil::TimestampToNanoseconds(next->create_time()));
        if ((job.state() == v1::JOB_STATE_RUNNING || job.state() == v1::JOB_STATE_QUEUED) &&
            better) {
          next = job;
        }
      }
      cancel_running_ = false;
      Update(next->id(), v1::WATCH_EVENT_TYPE_STATE_CHANGED, [](v1::Job& job) {
        job.set_state(v1::JOB_STATE_RUNNING);
        if (!job.has_start_time()) *job.mutable_start_time() = Now();
      });
      next = jobs_[next->id()];
    }
    const std::string id = next->id();
    spdlog::info("job {} running from step {}", id, next->current_step());
    const JobProgress progress{
        .on_published =
            [this, &id](int64_t version) {
              absl::MutexLock lock(&mutex_);
              Update(id, v1::WATCH_EVENT_TYPE_UNSPECIFIED,
                     [version](v1::Job& job) { job.set_policy_version(version); });
            },
        .on_step =
            [this, &id](const v1::StepMetrics& metrics) {
              RecordStepMetrics(id, metrics);
              absl::MutexLock lock(&mutex_);
              Update(id, v1::WATCH_EVENT_TYPE_STEP_COMPLETED, [&metrics](v1::Job& job) {
                job.set_current_step(metrics.step());
                *job.mutable_latest_metrics() = metrics;
              });
            }};
    const absl::Status result = RunJob(*next, options_.environment, progress, cancel_running_);
    absl::MutexLock lock(&mutex_);
    if (stopping_) return;  // Shutdown, not the job's end: it resumes after a restart.
    Update(id, v1::WATCH_EVENT_TYPE_STATE_CHANGED, [&result](v1::Job& job) {
      // A cancel that raced with the last step still ends CANCELLED (never CANCELLING ->
      // SUCCEEDED); the versions it published remain.
      if (job.state() == v1::JOB_STATE_CANCELLING && (result.ok() || absl::IsCancelled(result))) {
        job.set_state(v1::JOB_STATE_CANCELLED);
      } else if (result.ok()) {
        job.set_state(v1::JOB_STATE_SUCCEEDED);
      } else {
        job.set_state(v1::JOB_STATE_FAILED);
        job.set_error_message(result.ToString());
      }
      *job.mutable_end_time() = Now();
    });
    spdlog::info("job {} {}", id, v1::JobState_Name(jobs_[id].state()));
  }
}

grpc::ServerUnaryReactor* JobServiceImpl::CreateJob(grpc::CallbackServerContext* context,
                                                    const v1::CreateJobRequest* request,
                                                    v1::CreateJobResponse* response) {
  return FinishWithJob(context, Create(*request), response);
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(grpc::CallbackServerContext* context,
                                                 const v1::GetJobRequest* request,
                                                 v1::GetJobResponse* response) {
  return FinishWithJob(context, Get(request->job_id()), response);
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(grpc::CallbackServerContext* context,
                                                   const v1::ListJobsRequest* request,
                                                   v1::ListJobsResponse* response) {
  return FinishUnary(context, List(*request), response);
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(grpc::CallbackServerContext* context,
                                                    const v1::CancelJobRequest* request,
                                                    v1::CancelJobResponse* response) {
  return FinishWithJob(context, Cancel(request->job_id()), response);
}

grpc::ServerWriteReactor<v1::WatchJobResponse>* JobServiceImpl::WatchJob(
    grpc::CallbackServerContext* /*context*/, const v1::WatchJobRequest* request) {
  return new WatchReactor(*this, request->job_id());
}

}  // namespace tandem::trainer
