#include "services/trainer/api/job_manager.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <optional>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/identifier.h"
#include "common/logging.h"
#include "common/proto_time.h"
#include "common/status.h"
#include "common/utf8.h"
#include "google/protobuf/unknown_field_set.h"
#include "google/protobuf/util/message_differencer.h"
#include "services/trainer/api/job_spec.h"
#include "services/trainer/api/trainer_metrics.h"
#include "services/trainer/job/checkpoint.h"

namespace tandem::trainer {
namespace {

constexpr int kDefaultPageSize = 50;
constexpr int kMaxPageSize = 1000;
// A page stops before this many bytes of jobs (a quarter of the trainer's default message
// limit), so listing works however large the jobs' strings are.
constexpr size_t kMaxPageBytes = size_t{4} << 20;
// How long the worker waits before trying again to record that a job starts or ends (disk
// trouble).
constexpr absl::Duration kSaveRetryInterval = absl::Seconds(1);

// A run's result as the job's terminal state. A cancel that raced with the last step still
// ends CANCELLED (never CANCELLING -> SUCCEEDED); the versions it published remain.
void RecordOutcome(const absl::Status& result, trainer::v1::Job& job) {
  job.clear_status_message();
  if (job.state() == trainer::v1::JOB_STATE_CANCELLING &&
      (result.ok() || absl::IsCancelled(result))) {
    job.set_state(trainer::v1::JOB_STATE_CANCELLED);
  } else if (result.ok()) {
    job.set_state(trainer::v1::JOB_STATE_SUCCEEDED);
  } else {
    job.set_state(trainer::v1::JOB_STATE_FAILED);
    // The code and message, without the payloads (error details) a status may carry.
    job.set_error_message(ValidUtf8(
        TruncateStatusMessage(result.ToString(absl::StatusToStringMode::kWithNoExtraData))));
  }
  *job.mutable_end_time() = NowTimestamp();
}

std::string NewJobId() {
  std::random_device random;
  return absl::StrFormat("job-%06x%06x", random() & 0xffffff, random() & 0xffffff);
}

absl::Status RequireJobId(const std::string& job_id) {
  if (job_id.empty()) return InvalidField("job_id", "job_id is required");
  return ValidateIdentifier("job_id", job_id);
}

// A change a client asked for that could not be made durable: not acknowledged. Keeps the
// store's code (RESOURCE_EXHAUSTED for a full disk) and path.
absl::Status Unpersisted(const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("the job record could not be saved, so nothing "
                                                  "changed: ",
                                                  status.message()));
}

std::string JobName(absl::string_view job_id) { return absl::StrCat("jobs/", job_id); }

absl::Status JobNotFound(const std::string& job_id) {
  return WithErrorInfo(absl::NotFoundError(absl::StrCat("job ", job_id, " not found")),
                       "JOB_NOT_FOUND", {{"job", job_id}});
}

// A new job's output_dir that belongs to someone else.
absl::Status OutputDirTaken(const std::string& dir, absl::string_view why) {
  return WithErrorInfo(
      absl::FailedPreconditionError(absl::StrCat("spec.output_dir: ", dir, " ", why,
                                                 "; a new job needs a directory of its own")),
      "OUTPUT_DIR_IN_USE", {{"field", "spec.output_dir"}, {"directory", dir}});
}

// JobSpec.endpoints (field 18) was removed: a client that still sends it would otherwise have
// it kept as unknown bytes and ignored. (Jobs stored by earlier trainers keep theirs.)
absl::Status RefuseRemovedFields(const trainer::v1::JobSpec& spec) {
  constexpr int kRemovedEndpoints = 18;
  const google::protobuf::UnknownFieldSet& unknown = spec.GetReflection()->GetUnknownFields(spec);
  for (int i = 0; i < unknown.field_count(); ++i) {
    if (unknown.field(i).number() == kRemovedEndpoints) {
      return InvalidField("spec.endpoints",
                          "spec.endpoints was removed: the trainer's --rollout, --weight_store "
                          "and --router_replay flags say where the services run");
    }
  }
  return absl::OkStatus();
}

bool IsTerminal(const trainer::v1::Job& job) {
  return job.state() == trainer::v1::JOB_STATE_SUCCEEDED ||
         job.state() == trainer::v1::JOB_STATE_FAILED ||
         job.state() == trainer::v1::JOB_STATE_CANCELLED;
}

bool Runnable(const trainer::v1::Job& job) {
  return job.state() == trainer::v1::JOB_STATE_RUNNING ||
         job.state() == trainer::v1::JOB_STATE_QUEUED;
}

// A run of the job begins after `start_step`: a resume leaves the previous attempt's metrics
// behind, and one that lost steps (no checkpoint) says so in the log as well as in the job.
void StartAttempt(int64_t start_step, trainer::v1::Job& job) {
  job.set_attempt(job.attempt() + 1);
  job.set_attempt_start_step(start_step);
  if (job.attempt() == 1) return;
  job.clear_latest_metrics();
  if (start_step < job.current_step()) {
    spdlog::warn("job {} attempt {} restarts after step {}: steps {}..{} run again", job.id(),
                 job.attempt(), start_step, start_step + 1, job.current_step());
  }
}

// Newest first; ties (same create time) by id.
bool NewerFirst(const trainer::v1::Job& a, const trainer::v1::Job& b) {
  const absl::Time ta = FromTimestamp(a.create_time()), tb = FromTimestamp(b.create_time());
  return ta != tb ? ta > tb : a.id() < b.id();
}

// Jobs found RUNNING at start resume first, then the oldest queued job.
bool RunsBefore(const trainer::v1::Job& a, const trainer::v1::Job& b) {
  const bool a_running = a.state() == trainer::v1::JOB_STATE_RUNNING;
  if (a_running != (b.state() == trainer::v1::JOB_STATE_RUNNING)) return a_running;
  return FromTimestamp(a.create_time()) < FromTimestamp(b.create_time());
}

// A page token names the offset and the filter it belongs to: "<offset>/<states>".
std::string FilterKey(const trainer::v1::ListJobsRequest& request) {
  std::vector<int> states(request.states().begin(), request.states().end());
  std::sort(states.begin(), states.end());
  return absl::StrJoin(states, ",");
}

}  // namespace

JobManager::JobManager(std::string data_dir, JobRunner runner, TrainerDeployment deployment,
                       std::unique_ptr<JobStore> store)
    : data_dir_(std::move(data_dir)),
      deployment_(deployment),
      runner_(std::move(runner)),
      store_(std::move(store)) {}

absl::StatusOr<std::unique_ptr<JobManager>> JobManager::Open(const std::string& data_dir,
                                                             JobRunner runner,
                                                             TrainerDeployment deployment) {
  auto store = JobStore::Open(data_dir);
  if (!store.ok()) return store.status();
  std::unique_ptr<JobManager> manager(
      new JobManager(data_dir, std::move(runner), deployment, *std::move(store)));
  {
    absl::MutexLock lock(&manager->mutex_);
    for (const trainer::v1::Job& job : manager->store_->loaded()) {
      manager->jobs_[job.id()] = job;
      manager->jobs_[job.id()].set_name(JobName(job.id()));  // Records before names had none.
      manager->by_request_id_[job.request_id()] = job.id();
      // A cancel that was in progress when the trainer stopped is complete now.
      if (job.state() == trainer::v1::JOB_STATE_CANCELLING) {
        manager->UpdateOrLog(job.id(), trainer::v1::WATCH_EVENT_TYPE_STATE_CHANGED,
                             [](trainer::v1::Job& j) {
                               j.set_state(trainer::v1::JOB_STATE_CANCELLED);
                               *j.mutable_end_time() = NowTimestamp();
                             });
      }
      if (Runnable(job)) manager->ReresolveSpec(job);
    }
    RecordJobCounts(manager->AllJobs());
  }
  manager->worker_ = std::thread([raw = manager.get()] { raw->WorkLoop(); });
  return manager;
}

JobManager::~JobManager() {
  {
    absl::MutexLock lock(&mutex_);
    stopping_ = true;
  }
  cancel_running_ = true;  // The run stops; its job stays RUNNING on disk and resumes later.
  worker_.join();
}

std::vector<trainer::v1::Job> JobManager::AllJobs() const {
  std::vector<trainer::v1::Job> jobs;
  for (const auto& [id, job] : jobs_) jobs.push_back(job);
  return jobs;
}

absl::Status JobManager::Update(const std::string& job_id, trainer::v1::WatchEventType event,
                                const std::function<void(trainer::v1::Job&)>& change) {
  auto [entry, created] = jobs_.try_emplace(job_id);
  trainer::v1::Job& job = entry->second;
  const trainer::v1::Job before = job;
  change(job);
  *job.mutable_update_time() = NowTimestamp();
  if (absl::Status status = store_->Put(job); !status.ok()) {
    if (created) {
      jobs_.erase(entry);
    } else {
      job = before;
    }
    return status;
  }
  if (event == trainer::v1::WATCH_EVENT_TYPE_UNSPECIFIED) return absl::OkStatus();
  trainer::v1::WatchJobResponse response;
  response.set_type(event);
  *response.mutable_job() = job;
  for (auto& [id, subscription] : subscriptions_) {
    if (subscription.job_id == job_id) subscription.listener(response);
  }
  if (event == trainer::v1::WATCH_EVENT_TYPE_STATE_CHANGED) {
    RecordJobCounts(AllJobs());
    if (IsTerminal(job) && !IsTerminal(before)) RecordJobEnded(job.state());
  }
  return absl::OkStatus();
}

void JobManager::UpdateOrLog(const std::string& job_id, trainer::v1::WatchEventType event,
                             const std::function<void(trainer::v1::Job&)>& change) {
  if (absl::Status status = Update(job_id, event, change); !status.ok()) {
    spdlog::error("job {}: cannot persist its record, so the change is not applied: {}", job_id,
                  status.ToString());
  }
}

absl::StatusOr<int64_t> JobManager::Subscribe(const std::string& job_id, Listener listener) {
  if (absl::Status status = RequireJobId(job_id); !status.ok()) return status;
  absl::MutexLock lock(&mutex_);
  auto found = jobs_.find(job_id);
  if (found == jobs_.end()) return JobNotFound(job_id);
  trainer::v1::WatchJobResponse snapshot;
  snapshot.set_type(trainer::v1::WATCH_EVENT_TYPE_SNAPSHOT);
  *snapshot.mutable_job() = found->second;
  listener(snapshot);
  const int64_t id = next_subscription_++;
  subscriptions_[id] = {job_id, std::move(listener)};
  return id;
}

void JobManager::Unsubscribe(int64_t subscription) {
  absl::MutexLock lock(&mutex_);
  subscriptions_.erase(subscription);
}

absl::StatusOr<trainer::v1::JobSpec> JobManager::Resolve(const trainer::v1::JobSpec& spec,
                                                         const std::string& job_id) const {
  absl::StatusOr<trainer::v1::JobSpec> resolved =
      ResolveJobSpec(spec, job_id, absl::StrCat(data_dir_, "/", job_id));
  if (!resolved.ok()) return resolved;
  const int ranks = deployment_.trainer_ranks;
  const trainer::v1::Parallelism& parallelism = resolved->parallelism();
  const int64_t asked = int64_t{parallelism.data_parallel()} * parallelism.expert_parallel();
  if (asked > ranks) {
    const std::string field = parallelism.expert_parallel() > 1 ? "spec.parallelism.expert_parallel"
                                                                : "spec.parallelism.data_parallel";
    return InvalidField(
        field, absl::StrCat("spec.parallelism asks for ", asked, " trainer ranks (data_parallel ",
                            parallelism.data_parallel(), " x expert_parallel ",
                            parallelism.expert_parallel(), "); this trainer deployment has ", ranks,
                            " rank", ranks == 1 ? "" : "s", " (the trainer's --ranks)"));
  }
  if (resolved->routing_replay() == trainer::v1::ROUTING_REPLAY_MODE_R3 &&
      !deployment_.router_replay) {
    return WithErrorInfo(
        absl::FailedPreconditionError(
            "spec.routing_replay is R3 (the default), and this trainer has no router-replay "
            "(--router_replay): configure one, or choose another routing_replay"),
        "ROUTER_REPLAY_NOT_CONFIGURED", {{"field", "spec.routing_replay"}});
  }
  return resolved;
}

void JobManager::ReresolveSpec(const trainer::v1::Job& job) {
  absl::StatusOr<trainer::v1::JobSpec> resolved = Resolve(job.spec(), job.id());
  if (resolved.ok() && google::protobuf::util::MessageDifferencer::Equals(*resolved, job.spec())) {
    return;
  }
  UpdateOrLog(job.id(),
              resolved.ok() ? trainer::v1::WATCH_EVENT_TYPE_UNSPECIFIED
                            : trainer::v1::WATCH_EVENT_TYPE_STATE_CHANGED,
              [&resolved](trainer::v1::Job& stored) {
                if (resolved.ok()) {
                  *stored.mutable_spec() = *resolved;
                  return;
                }
                RecordOutcome(absl::FailedPreconditionError(
                                  absl::StrCat("the spec no longer passes this trainer's checks: ",
                                               resolved.status().message())),
                              stored);
              });
}

absl::StatusOr<trainer::v1::Job> JobManager::Create(const trainer::v1::CreateJobRequest& request) {
  if (absl::Status status = ValidateIdentifier("request_id", request.request_id()); !status.ok()) {
    return status;
  }
  absl::MutexLock lock(&mutex_);
  if (auto existing = by_request_id_.find(request.request_id()); existing != by_request_id_.end()) {
    const trainer::v1::Job& job = jobs_[existing->second];
    auto resolved = Resolve(request.spec(), job.id());
    if (!resolved.ok()) return resolved.status();
    if (google::protobuf::util::MessageDifferencer::Equals(*resolved, job.spec())) return job;
    return WithErrorInfo(absl::AlreadyExistsError(absl::StrCat("request_id ", request.request_id(),
                                                               " already created job ", job.id(),
                                                               " with a different spec")),
                         "REQUEST_ID_REUSED",
                         {{"request_id", request.request_id()}, {"job", job.id()}});
  }
  if (absl::Status status = RefuseRemovedFields(request.spec()); !status.ok()) return status;
  const std::string id = NewJobId();
  auto spec = Resolve(request.spec(), id);
  if (!spec.ok()) return spec.status();
  if (absl::Status status = CheckOutputDirIsNew(*spec); !status.ok()) return status;
  if (absl::Status status = Update(id, trainer::v1::WATCH_EVENT_TYPE_STATE_CHANGED,
                                   [&](trainer::v1::Job& job) {
                                     job.set_id(id);
                                     job.set_name(JobName(id));
                                     *job.mutable_spec() = *std::move(spec);
                                     job.set_state(trainer::v1::JOB_STATE_QUEUED);
                                     job.set_request_id(request.request_id());
                                     *job.mutable_create_time() = NowTimestamp();
                                   });
      !status.ok()) {
    return Unpersisted(status);
  }
  by_request_id_[request.request_id()] = id;
  spdlog::info("job {} queued ({} steps)", id, jobs_[id].spec().num_steps());
  return jobs_[id];
}

absl::Status JobManager::CheckOutputDirIsNew(const trainer::v1::JobSpec& spec) const {
  const std::string& dir = spec.output_dir();
  const bool starts_from_it = spec.initial_checkpoint_dir() == dir;
  for (const auto& [id, job] : jobs_) {
    // Handing a directory over to a job that starts from its checkpoint waits for its owner.
    if (job.spec().output_dir() == dir && (!starts_from_it || !IsTerminal(job))) {
      return OutputDirTaken(dir,
                            absl::StrCat("is the output_dir of job ", id, " (",
                                         trainer::v1::JobState_Name(job.state()).substr(10), ")"));
    }
  }
  std::error_code error;
  if (!std::filesystem::exists(dir, error)) return absl::OkStatus();
  if (!std::filesystem::is_directory(dir, error)) return OutputDirTaken(dir, "is not a directory");
  if (starts_from_it) return absl::OkStatus();  // Its checkpoint is checked when the job starts.
  auto checkpoint = ReadCheckpointSummary(dir);
  if (!checkpoint.ok()) {
    return OutputDirTaken(dir, absl::StrCat("holds a checkpoint that cannot be read (",
                                            checkpoint.status().message(), ")"));
  }
  if (checkpoint->has_value()) {
    const std::string& owner = (*checkpoint)->owner.job_id;
    return OutputDirTaken(
        dir, absl::StrCat("holds the checkpoint of ", owner.empty() ? "an unnamed job" : owner,
                          " (step ", (*checkpoint)->step,
                          "); to start from it, name it in initial_checkpoint_dir"));
  }
  auto entries = std::filesystem::directory_iterator(dir, error);
  if (error) return OutputDirTaken(dir, absl::StrCat("cannot be listed: ", error.message()));
  if (entries != std::filesystem::directory_iterator()) {
    return OutputDirTaken(
        dir, absl::StrCat("is not empty (it holds '", entries->path().filename().string(), "')"));
  }
  return absl::OkStatus();
}

absl::StatusOr<trainer::v1::Job> JobManager::Get(const std::string& job_id) const {
  if (absl::Status status = RequireJobId(job_id); !status.ok()) return status;
  absl::MutexLock lock(&mutex_);
  auto found = jobs_.find(job_id);
  if (found == jobs_.end()) return JobNotFound(job_id);
  return found->second;
}

absl::StatusOr<trainer::v1::ListJobsResponse> JobManager::List(
    const trainer::v1::ListJobsRequest& request) const {
  if (request.page_size() < 0) return InvalidField("page_size", "page_size must be >= 0");
  for (int i = 0; i < request.states_size(); ++i) {
    const int state = request.states(i);
    if (state == trainer::v1::JOB_STATE_UNSPECIFIED || !trainer::v1::JobState_IsValid(state)) {
      return InvalidField(IndexPath("states", i),
                          absl::StrCat("states: ", state, " is not a job state"));
    }
  }
  const int page_size =
      request.page_size() == 0 ? kDefaultPageSize : std::min(request.page_size(), kMaxPageSize);
  int64_t offset = 0;
  if (!request.page_token().empty()) {
    const std::vector<std::string> parts = absl::StrSplit(request.page_token(), '/');
    // Offsets are bounded so that offset + page_size cannot overflow.
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &offset) || offset < 0 ||
        offset > std::numeric_limits<int32_t>::max() || parts[1] != FilterKey(request)) {
      return InvalidField("page_token", "page_token is malformed or belongs to another filter");
    }
  }
  std::vector<trainer::v1::Job> jobs;
  {
    absl::MutexLock lock(&mutex_);
    for (const auto& [id, job] : jobs_) {
      if (request.states().empty() || std::find(request.states().begin(), request.states().end(),
                                                job.state()) != request.states().end()) {
        jobs.push_back(job);
      }
    }
  }
  std::sort(jobs.begin(), jobs.end(), NewerFirst);
  trainer::v1::ListJobsResponse response;
  size_t page_bytes = 0;
  int64_t next = offset;
  for (; next < static_cast<int64_t>(jobs.size()) && next < offset + page_size; ++next) {
    const size_t bytes = jobs[next].ByteSizeLong();
    if (next > offset && page_bytes + bytes > kMaxPageBytes) break;  // Never an empty page.
    page_bytes += bytes;
    *response.add_jobs() = std::move(jobs[next]);
  }
  if (next < static_cast<int64_t>(jobs.size())) {
    response.set_next_page_token(absl::StrCat(next, "/", FilterKey(request)));
  }
  return response;
}

absl::StatusOr<trainer::v1::Job> JobManager::Cancel(const std::string& job_id) {
  if (absl::Status status = RequireJobId(job_id); !status.ok()) return status;
  absl::MutexLock lock(&mutex_);
  auto found = jobs_.find(job_id);
  if (found == jobs_.end()) return JobNotFound(job_id);
  switch (found->second.state()) {
    case trainer::v1::JOB_STATE_SUCCEEDED:
    case trainer::v1::JOB_STATE_FAILED:
      return WithErrorInfo(absl::FailedPreconditionError(absl::StrCat(
                               "job ", job_id, " is already ",
                               trainer::v1::JobState_Name(found->second.state()).substr(10))),
                           "JOB_ALREADY_ENDED", {{"job", job_id}});
    case trainer::v1::JOB_STATE_QUEUED:
      if (absl::Status status = Update(job_id, trainer::v1::WATCH_EVENT_TYPE_STATE_CHANGED,
                                       [](trainer::v1::Job& job) {
                                         job.set_state(trainer::v1::JOB_STATE_CANCELLED);
                                         *job.mutable_end_time() = NowTimestamp();
                                       });
          !status.ok()) {
        return Unpersisted(status);
      }
      break;
    case trainer::v1::JOB_STATE_RUNNING:
      if (absl::Status status = Update(
              job_id, trainer::v1::WATCH_EVENT_TYPE_STATE_CHANGED,
              [](trainer::v1::Job& job) { job.set_state(trainer::v1::JOB_STATE_CANCELLING); });
          !status.ok()) {
        return Unpersisted(status);
      }
      cancel_running_ = true;
      break;
    default:  // CANCELLING or CANCELLED: nothing to do.
      break;
  }
  return jobs_[job_id];
}

std::optional<trainer::v1::Job> JobManager::StartNextJob() {
  absl::MutexLock lock(&mutex_);
  const auto runnable = [this]() {
    mutex_.AssertHeld();
    return stopping_ || std::any_of(jobs_.begin(), jobs_.end(),
                                    [](const auto& entry) { return Runnable(entry.second); });
  };
  while (true) {
    mutex_.Await(absl::Condition(&runnable));
    if (stopping_) return std::nullopt;
    const trainer::v1::Job* next = nullptr;
    for (const auto& [id, job] : jobs_) {
      if (Runnable(job) && (next == nullptr || RunsBefore(job, *next))) next = &job;
    }
    const std::string id = next->id();
    cancel_running_ = false;
    const absl::Status started =
        Update(id, trainer::v1::WATCH_EVENT_TYPE_STATE_CHANGED, [](trainer::v1::Job& job) {
          job.set_state(trainer::v1::JOB_STATE_RUNNING);
          if (!job.has_start_time()) *job.mutable_start_time() = NowTimestamp();
        });
    if (started.ok()) return jobs_[id];
    // A job whose start cannot be recorded does not run (its restart would not resume it).
    PauseAfterSaveFailure(absl::StrCat("job ", id, " cannot start"), started);
  }
}

JobProgress JobManager::ProgressOf(const std::string& job_id) {
  return {.on_attempt_start =
              [this, job_id](int64_t start_step) {
                // The earlier attempt's steps are not this one's.
                ForgetJobMetrics(job_id, absl::Now(), absl::ZeroDuration());
                RecordAttemptStart(job_id, absl::Now());
                absl::MutexLock lock(&mutex_);
                UpdateOrLog(job_id, trainer::v1::WATCH_EVENT_TYPE_ATTEMPT_STARTED,
                            [start_step](trainer::v1::Job& job) { StartAttempt(start_step, job); });
              },
          .on_published =
              [this, job_id](int64_t version) {
                absl::MutexLock lock(&mutex_);
                UpdateOrLog(job_id, trainer::v1::WATCH_EVENT_TYPE_UNSPECIFIED,
                            [version](trainer::v1::Job& job) { job.set_policy_version(version); });
              },
          .on_step =
              [this, job_id](const trainer::v1::StepMetrics& metrics) {
                RecordStepMetrics(job_id, metrics);
                absl::MutexLock lock(&mutex_);
                UpdateOrLog(job_id, trainer::v1::WATCH_EVENT_TYPE_STEP_COMPLETED,
                            [&metrics](trainer::v1::Job& job) {
                              // An attempt that restarted without a checkpoint repeats steps:
                              // progress stays where the furthest attempt got.
                              job.set_current_step(std::max(job.current_step(), metrics.step()));
                              *job.mutable_latest_metrics() = metrics;
                              job.mutable_latest_metrics()->set_attempt(job.attempt());
                            });
              },
          .on_status =
              [this, job_id](const std::string& status) {
                absl::MutexLock lock(&mutex_);
                UpdateOrLog(job_id, trainer::v1::WATCH_EVENT_TYPE_STATUS_CHANGED,
                            [&status](trainer::v1::Job& job) { job.set_status_message(status); });
              }};
}

void JobManager::Finish(const std::string& job_id, const absl::Status& result) {
  // Before the end is told: whoever sees the job ended sees its series going (at once with no
  // grace).
  ForgetJobMetrics(job_id, absl::Now(), deployment_.ended_job_series_grace);
  // A job whose end cannot be recorded is not run again (it would publish more versions): the
  // record is retried until it is saved or the manager stops (then a restart resumes the job).
  while (true) {
    const absl::Status saved =
        Update(job_id, trainer::v1::WATCH_EVENT_TYPE_STATE_CHANGED,
               [&result](trainer::v1::Job& job) { RecordOutcome(result, job); });
    if (saved.ok() || stopping_) break;
    PauseAfterSaveFailure(absl::StrCat("job ", job_id, " ended but its record cannot be saved"),
                          saved);
  }
  spdlog::info("job {} {}", job_id, trainer::v1::JobState_Name(jobs_[job_id].state()));
}

void JobManager::PauseAfterSaveFailure(const std::string& what, const absl::Status& status) {
  spdlog::error("{}: {}; retrying in {}", what, status.ToString(),
                absl::FormatDuration(kSaveRetryInterval));
  const auto stopping = [this]() {
    mutex_.AssertHeld();
    return stopping_;
  };
  mutex_.AwaitWithTimeout(absl::Condition(&stopping), kSaveRetryInterval);
}

void JobManager::WorkLoop() {
  while (std::optional<trainer::v1::Job> job = StartNextJob()) {
    spdlog::info("job {} running from step {}", job->id(), job->current_step());
    const absl::Status result = runner_(*job, ProgressOf(job->id()), cancel_running_);
    absl::MutexLock lock(&mutex_);
    if (stopping_) return;  // Shutdown, not the job's end: it resumes after a restart.
    Finish(job->id(), result);
  }
}

}  // namespace tandem::trainer
