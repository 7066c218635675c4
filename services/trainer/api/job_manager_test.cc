// The Job API's core with a scripted job runner: states, cancellation, persistence, resume
// order, idempotent creation and subscriptions, with no gRPC and no other services.
#include "services/trainer/api/job_manager.h"

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "common/status.h"
#include "common/testing/test_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/metric_family.h"
#include "services/trainer/api/job_spec_testing.h"
#include "services/trainer/api/job_store.h"
#include "services/trainer/api/trainer_metrics.h"

namespace tandem::trainer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A job runner the test drives: each run reports one published version and one step, then
// waits until the test ends it with an outcome or the manager cancels it.
class ScriptedRunner {
 public:
  JobRunner runner() {
    return [this](const trainer::v1::Job& job, const JobProgress& progress,
                  const std::atomic<bool>& cancelled) { return Run(job, progress, cancelled); };
  }

  // Waits until job `id` is running; false after 10 s.
  bool AwaitRunning(const std::string& id) {
    absl::MutexLock lock(&mutex_);
    const auto running = [&] {
      mutex_.AssertHeld();
      return running_ == id;
    };
    return mutex_.AwaitWithTimeout(absl::Condition(&running), absl::Seconds(10));
  }

  void End(absl::Status outcome) {
    absl::MutexLock lock(&mutex_);
    outcome_ = std::move(outcome);
  }

  // Later runs start from step 0, as a job without a checkpoint does after a restart.
  void RestartFromScratch() { restarts_from_scratch_ = true; }

  std::vector<std::string> started() {
    absl::MutexLock lock(&mutex_);
    return started_;
  }

 private:
  absl::Status Run(const trainer::v1::Job& job, const JobProgress& progress,
                   const std::atomic<bool>& cancelled) {
    const int64_t start_step = restarts_from_scratch_ ? 0 : job.current_step();
    progress.on_attempt_start(start_step);
    progress.on_published(7);
    trainer::v1::StepMetrics metrics;
    metrics.set_step(start_step + 1);
    metrics.set_accuracy(0.5);
    progress.on_step(metrics);
    absl::MutexLock lock(&mutex_);
    started_.push_back(job.id());
    running_ = job.id();
    const auto done = [&] {
      mutex_.AssertHeld();
      return outcome_.has_value() || cancelled.load();
    };
    // The manager's cancel flag is no Mutex condition: poll it briefly.
    while (!mutex_.AwaitWithTimeout(absl::Condition(&done), absl::Milliseconds(2))) {
    }
    running_.clear();
    if (!outcome_.has_value()) return absl::CancelledError("job cancelled");
    absl::Status outcome = *std::move(outcome_);
    outcome_.reset();
    return outcome;
  }

  std::atomic<bool> restarts_from_scratch_{false};
  absl::Mutex mutex_;
  std::vector<std::string> started_ ABSL_GUARDED_BY(mutex_);
  std::string running_ ABSL_GUARDED_BY(mutex_);
  std::optional<absl::Status> outcome_ ABSL_GUARDED_BY(mutex_);
};

class JobManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tandem::testing::FreshTestDir("job_manager");
    Reopen();
  }

  void Reopen() {
    jobs_.reset();
    auto jobs = JobManager::Open(dir_, runner_.runner());
    ASSERT_TRUE(jobs.ok()) << jobs.status();
    jobs_ = *std::move(jobs);
  }

  std::string Create(const std::string& request_id,
                     trainer::v1::JobSpec spec = MinimalValidSpec()) {
    trainer::v1::CreateJobRequest request;
    request.set_request_id(request_id);
    *request.mutable_spec() = std::move(spec);
    auto job = jobs_->Create(request);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id() : "";
  }

  // Waits until the job is in `state`; returns the job as it is then.
  trainer::v1::Job AwaitState(const std::string& id, trainer::v1::JobState state) {
    trainer::v1::Job job;
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    do {
      job = *jobs_->Get(id);
      if (job.state() == state) break;
      absl::SleepFor(absl::Milliseconds(1));
    } while (absl::Now() < deadline);
    EXPECT_EQ(trainer::v1::JobState_Name(job.state()), trainer::v1::JobState_Name(state)) << id;
    return job;
  }

  std::string dir_;
  ScriptedRunner runner_;
  std::unique_ptr<JobManager> jobs_;
};

TEST_F(JobManagerTest, AJobRunsToSuccessWithItsProgressRecorded) {
  const std::string id = Create("r1");
  ASSERT_TRUE(runner_.AwaitRunning(id));
  const trainer::v1::Job running = *jobs_->Get(id);
  EXPECT_EQ(running.state(), trainer::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(running.policy_version(), 7);
  EXPECT_EQ(running.current_step(), 1);
  EXPECT_DOUBLE_EQ(running.latest_metrics().accuracy(), 0.5);
  EXPECT_TRUE(running.has_start_time());
  EXPECT_EQ(running.spec().adapter_name(), id) << "stored with defaults resolved";
  EXPECT_EQ(running.spec().output_dir(), absl::StrCat(dir_, "/", id));
  runner_.End(absl::OkStatus());
  const trainer::v1::Job done = AwaitState(id, trainer::v1::JOB_STATE_SUCCEEDED);
  EXPECT_TRUE(done.has_end_time());
  EXPECT_TRUE(done.error_message().empty());
}

// Every Prometheus series labelled with `job_id`, as a scrape would list them.
std::vector<std::string> SeriesOf(const std::string& job_id) {
  std::vector<std::string> series;
  for (const prometheus::MetricFamily& family : MetricsRegistry().Collect()) {
    for (const prometheus::ClientMetric& metric : family.metric) {
      for (const prometheus::ClientMetric::Label& label : metric.label) {
        if (label.name == "job_id" && label.value == job_id) series.push_back(family.name);
      }
    }
  }
  return series;
}

TEST_F(JobManagerTest, AJobsSeriesEndWithIt) {
  const std::string id = Create("r1");
  ASSERT_TRUE(runner_.AwaitRunning(id));
  EXPECT_THAT(SeriesOf(id),
              ::testing::IsSupersetOf({"tandem_trainer_step", "tandem_trainer_accuracy",
                                       "tandem_trainer_job_attempt_start_time_seconds"}));
  runner_.End(absl::OkStatus());
  AwaitState(id, trainer::v1::JOB_STATE_SUCCEEDED);
  // The attempt's start goes at once; the steps once scrapes had time to see the last one.
  EXPECT_THAT(SeriesOf(id),
              ::testing::Not(::testing::Contains("tandem_trainer_job_attempt_start_time_seconds")));
  EXPECT_THAT(SeriesOf(id), ::testing::Contains("tandem_trainer_step"));
  RemoveRetiredJobSeries(absl::Now() + absl::Minutes(3));
  EXPECT_THAT(SeriesOf(id), ::testing::IsEmpty());
}

TEST_F(JobManagerTest, ARunnerErrorFailsTheJobWithItsMessage) {
  const std::string id = Create("r1");
  ASSERT_TRUE(runner_.AwaitRunning(id));
  runner_.End(absl::FailedPreconditionError("base model: no such file"));
  const trainer::v1::Job failed = AwaitState(id, trainer::v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.error_message(), HasSubstr("base model: no such file"));
  EXPECT_EQ(jobs_->Cancel(id).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(JobManagerTest, JobsRunOneAtATimeOldestFirstAndCancelEndsQueuedAndRunningJobs) {
  const std::string first = Create("r1");
  ASSERT_TRUE(runner_.AwaitRunning(first));
  const std::string second = Create("r2");
  const std::string third = Create("r3");
  EXPECT_EQ(jobs_->Get(second)->state(), trainer::v1::JOB_STATE_QUEUED);

  EXPECT_EQ(jobs_->Cancel(second)->state(), trainer::v1::JOB_STATE_CANCELLED) << "queued: at once";
  EXPECT_EQ(jobs_->Cancel(first)->state(), trainer::v1::JOB_STATE_CANCELLING)
      << "running: at the runner";
  AwaitState(first, trainer::v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(jobs_->Cancel(first)->state(), trainer::v1::JOB_STATE_CANCELLED) << "idempotent";

  ASSERT_TRUE(runner_.AwaitRunning(third));
  runner_.End(absl::OkStatus());
  AwaitState(third, trainer::v1::JOB_STATE_SUCCEEDED);
  EXPECT_THAT(runner_.started(), ElementsAre(first, third));
}

TEST_F(JobManagerTest, ACancelRacingTheLastStepStillEndsCancelled) {
  const std::string id = Create("r1");
  ASSERT_TRUE(runner_.AwaitRunning(id));
  ASSERT_EQ(jobs_->Cancel(id)->state(), trainer::v1::JOB_STATE_CANCELLING);
  runner_.End(absl::OkStatus());  // The run finished its last step anyway.
  AwaitState(id, trainer::v1::JOB_STATE_CANCELLED);
}

TEST_F(JobManagerTest, ARestartResumesTheRunningJobBeforeOlderQueuedOnes) {
  const std::string first = Create("r1");
  ASSERT_TRUE(runner_.AwaitRunning(first));
  const std::string second = Create("r2");
  Reopen();  // The run is stopped, not ended: its job stays RUNNING on disk.
  ASSERT_TRUE(runner_.AwaitRunning(first));
  EXPECT_THAT(runner_.started(), ElementsAre(first, first));
  EXPECT_EQ(jobs_->Get(first)->current_step(), 2) << "the resumed run started from step 1";
  runner_.End(absl::OkStatus());
  ASSERT_TRUE(runner_.AwaitRunning(second));
  runner_.End(absl::OkStatus());
  AwaitState(second, trainer::v1::JOB_STATE_SUCCEEDED);
}

// A job without a checkpoint starts again from step 0 after a restart: its progress does not
// go back, and the new attempt's steps are told apart from the abandoned one's.
TEST_F(JobManagerTest, ARestartWithoutACheckpointNeverMovesTheStepBack) {
  const std::string id = Create("r1");
  ASSERT_TRUE(runner_.AwaitRunning(id));
  Reopen();
  ASSERT_TRUE(runner_.AwaitRunning(id));
  ASSERT_EQ(jobs_->Get(id)->current_step(), 2);
  runner_.RestartFromScratch();
  Reopen();
  ASSERT_TRUE(runner_.AwaitRunning(id));
  const trainer::v1::Job job = *jobs_->Get(id);
  EXPECT_EQ(job.current_step(), 2) << "steps completed never decrease";
  EXPECT_EQ(job.attempt(), 3);
  EXPECT_EQ(job.attempt_start_step(), 0) << "the restart without a checkpoint is told";
  EXPECT_EQ(job.latest_metrics().step(), 1);
  EXPECT_EQ(job.latest_metrics().attempt(), 3) << "the new attempt's step, not the old one's";
}

// Specs stored by an earlier trainer of jobs yet to finish are run as this trainer resolves
// them: defaults written out, or the job FAILED naming a limit it breaks.
TEST_F(JobManagerTest, UnfinishedJobsOfAnEarlierTrainerRunTheirSpecAsThisOneResolvesIt) {
  const std::string running = Create("r1");
  ASSERT_TRUE(runner_.AwaitRunning(running));
  const std::string queued = Create("r2");
  const std::string broken = Create("r3");
  jobs_.reset();
  {  // What an earlier trainer stored: no digits written out, and a rate float cannot hold.
    auto store = JobStore::Open(dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    for (trainer::v1::Job job : (*store)->loaded()) {
      if (job.id() == running || job.id() == queued)
        job.mutable_spec()->mutable_task()->clear_params();
      if (job.id() == broken)
        job.mutable_spec()->mutable_algorithm_config()->set_learning_rate(1e39);
      ASSERT_TRUE((*store)->Put(job).ok());
    }
  }
  Reopen();
  ASSERT_TRUE(runner_.AwaitRunning(running));
  for (const std::string& id : {running, queued}) {
    EXPECT_THAT(jobs_->Get(id)->spec().task().params(),
                ::testing::Contains(::testing::Pair("digits", "2")))
        << id;
  }
  const trainer::v1::Job failed = AwaitState(broken, trainer::v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.error_message(), HasSubstr("no longer passes"));
  EXPECT_THAT(failed.error_message(), HasSubstr("learning_rate is 1e+39"));
}

TEST_F(JobManagerTest, ACancelCutByARestartCompletesAtTheNextOpen) {
  const std::string id = Create("r1");
  ASSERT_TRUE(runner_.AwaitRunning(id));
  // Stop the manager while the job is CANCELLING: its state on disk stays CANCELLING.
  jobs_->Cancel(id).IgnoreError();
  Reopen();
  AwaitState(id, trainer::v1::JOB_STATE_CANCELLED);
}

TEST_F(JobManagerTest, RequestIdsMakeCreateIdempotentAcrossRestarts) {
  const std::string id = Create("same");
  EXPECT_EQ(Create("same"), id);
  Reopen();
  EXPECT_EQ(Create("same"), id);
  trainer::v1::JobSpec other = MinimalValidSpec();
  other.set_num_steps(4);
  trainer::v1::CreateJobRequest request;
  request.set_request_id("same");
  *request.mutable_spec() = other;
  const absl::Status conflict = jobs_->Create(request).status();
  EXPECT_TRUE(absl::IsAlreadyExists(conflict)) << conflict;
  EXPECT_THAT(conflict.message(), HasSubstr(id));
  EXPECT_EQ(ErrorReason(conflict), "REQUEST_ID_REUSED");
  request.clear_request_id();
  EXPECT_TRUE(absl::IsInvalidArgument(jobs_->Create(request).status()));
  request.set_request_id(std::string(257, 'x'));
  EXPECT_TRUE(absl::IsInvalidArgument(jobs_->Create(request).status()));
}

TEST_F(JobManagerTest, ABadSpecCreatesNoJob) {
  trainer::v1::JobSpec bad = MinimalValidSpec();
  bad.set_group_size(1);
  trainer::v1::CreateJobRequest request;
  request.set_request_id("bad");
  *request.mutable_spec() = bad;
  const absl::Status status = jobs_->Create(request).status();
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("spec.group_size"));
  EXPECT_EQ(ErrorReason(status), "INVALID_FIELD");
  EXPECT_EQ(jobs_->List({})->jobs_size(), 0);
}

// Each kind of refusal has a stable ErrorInfo reason a client can act on.
TEST_F(JobManagerTest, RefusalsCarryAStableReason) {
  EXPECT_EQ(ErrorReason(jobs_->Get("job-nope").status()), "JOB_NOT_FOUND");
  EXPECT_EQ(ErrorReason(jobs_->Get("").status()), "INVALID_FIELD");
  trainer::v1::JobSpec too_wide = MinimalValidSpec();
  too_wide.mutable_parallelism()->set_data_parallel(2);
  trainer::v1::CreateJobRequest request;
  request.set_request_id("wide");
  *request.mutable_spec() = too_wide;
  const absl::Status wide = jobs_->Create(request).status();
  ASSERT_EQ(FieldViolations(wide).size(), 1u) << wide;
  EXPECT_EQ(FieldViolations(wide)[0].field, "spec.parallelism.data_parallel");
  // A client of the old API still sending spec.endpoints (field 18) is told it was removed.
  trainer::v1::JobSpec old_client = MinimalValidSpec();
  old_client.GetReflection()->MutableUnknownFields(&old_client)->AddLengthDelimited(18, "x");
  request.set_request_id("old");
  *request.mutable_spec() = old_client;
  const absl::Status removed = jobs_->Create(request).status();
  ASSERT_EQ(FieldViolations(removed).size(), 1u) << removed;
  EXPECT_EQ(FieldViolations(removed)[0].field, "spec.endpoints");
}

// A trainer without router-replay refuses R3 jobs (the default mode) up front, and runs others.
TEST_F(JobManagerTest, WithoutRouterReplayR3JobsAreRefusedAndOthersRun) {
  jobs_.reset();
  auto jobs = JobManager::Open(dir_, runner_.runner(), {.router_replay = false});
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  jobs_ = *std::move(jobs);
  trainer::v1::CreateJobRequest request;
  request.set_request_id("r3");
  *request.mutable_spec() = MinimalValidSpec();
  const absl::Status refused = jobs_->Create(request).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("--router_replay"));
  EXPECT_EQ(ErrorReason(refused), "ROUTER_REPLAY_NOT_CONFIGURED");
  trainer::v1::JobSpec off = MinimalValidSpec();
  off.set_routing_replay(trainer::v1::ROUTING_REPLAY_MODE_OFF);
  EXPECT_FALSE(Create("off", off).empty());
}

TEST_F(JobManagerTest, SubscribersGetTheSnapshotThenEveryStateAndStepEvent) {
  const std::string id = Create("r1");
  ASSERT_TRUE(runner_.AwaitRunning(id));
  absl::Mutex mutex;
  std::vector<std::string> events;
  auto subscription = jobs_->Subscribe(id, [&](const trainer::v1::WatchJobResponse& event) {
    absl::MutexLock lock(&mutex);
    events.push_back(absl::StrCat(trainer::v1::WatchEventType_Name(event.type()), " ",
                                  trainer::v1::JobState_Name(event.job().state())));
  });
  ASSERT_TRUE(subscription.ok()) << subscription.status();
  runner_.End(absl::OkStatus());
  AwaitState(id, trainer::v1::JOB_STATE_SUCCEEDED);
  jobs_->Unsubscribe(*subscription);
  EXPECT_TRUE(absl::IsNotFound(jobs_->Subscribe("job-nope", [](const auto&) {}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(jobs_->Subscribe("", [](const auto&) {}).status()));
  absl::MutexLock lock(&mutex);
  EXPECT_THAT(events, ElementsAre("WATCH_EVENT_TYPE_SNAPSHOT JOB_STATE_RUNNING",
                                  "WATCH_EVENT_TYPE_STATE_CHANGED JOB_STATE_SUCCEEDED"));
}

}  // namespace
}  // namespace tandem::trainer

namespace tandem::trainer {
namespace {

// The one file of a job's record.
std::string RecordPath(const std::string& dir, const std::string& id) {
  return absl::StrCat(dir, "/jobs/", id, ".binpb");
}

TEST_F(JobManagerTest, AnErrorWithInvalidUtf8IsStoredEscapedAndStaysReadable) {
  const std::string id = Create("r1");
  ASSERT_TRUE(runner_.AwaitRunning(id));
  runner_.End(absl::FailedPreconditionError("base model: header \xFF\xFE is not JSON"));
  const trainer::v1::Job failed = AwaitState(id, trainer::v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.error_message(), HasSubstr("header \\xFF\\xFE is not JSON"));
  std::string bytes;
  ASSERT_TRUE(failed.SerializeToString(&bytes));
  Reopen();
  EXPECT_EQ(jobs_->Get(id)->error_message(), failed.error_message());
  EXPECT_EQ(jobs_->List({})->jobs_size(), 1);
}

TEST_F(JobManagerTest, ACorruptRecordIsQuarantinedAsAFailedJobAndTheRestLoad) {
  const std::string damaged = Create("r1");
  ASSERT_TRUE(runner_.AwaitRunning(damaged));
  runner_.End(absl::OkStatus());
  AwaitState(damaged, trainer::v1::JOB_STATE_SUCCEEDED);
  const std::string intact = Create("r2");
  ASSERT_TRUE(runner_.AwaitRunning(intact));
  jobs_.reset();
  // One byte in the middle of the record (say, a path in its spec).
  ASSERT_TRUE(tandem::testing::FlipByte(RecordPath(dir_, damaged), 40));
  Reopen();
  const trainer::v1::Job quarantined = *jobs_->Get(damaged);
  EXPECT_EQ(quarantined.state(), trainer::v1::JOB_STATE_FAILED);
  EXPECT_THAT(quarantined.error_message(), HasSubstr("checksum mismatch"));
  EXPECT_TRUE(std::filesystem::exists(RecordPath(dir_, damaged) + ".corrupt"));
  EXPECT_TRUE(runner_.AwaitRunning(intact)) << "the intact running job resumes";
  runner_.End(absl::OkStatus());
  AwaitState(intact, trainer::v1::JOB_STATE_SUCCEEDED);
  Reopen();  // The stand-in record is a valid record now.
  EXPECT_EQ(jobs_->Get(damaged)->state(), trainer::v1::JOB_STATE_FAILED);
}

TEST_F(JobManagerTest, ARecordThatCannotBeSavedIsNotAcknowledged) {
  const std::string running = Create("r1");
  ASSERT_TRUE(runner_.AwaitRunning(running));
  const std::string queued = Create("r2");
  // The jobs directory becomes a plain file: every write fails, even for root.
  std::filesystem::rename(dir_ + "/jobs", dir_ + "/jobs.saved");
  { std::ofstream(dir_ + "/jobs") << "not a directory"; }

  trainer::v1::CreateJobRequest request;
  request.set_request_id("r3");
  *request.mutable_spec() = MinimalValidSpec();
  const absl::Status create = jobs_->Create(request).status();
  EXPECT_FALSE(create.ok());
  EXPECT_THAT(create.message(), HasSubstr("could not be saved"));
  EXPECT_THAT(create.message(), HasSubstr(dir_ + "/jobs/"));
  EXPECT_EQ(jobs_->List({})->jobs_size(), 2) << "no job was created";

  const absl::Status cancel = jobs_->Cancel(queued).status();
  EXPECT_FALSE(cancel.ok());
  EXPECT_EQ(jobs_->Get(queued)->state(), trainer::v1::JOB_STATE_QUEUED)
      << "the cancel did not happen";

  std::filesystem::remove(dir_ + "/jobs");
  std::filesystem::rename(dir_ + "/jobs.saved", dir_ + "/jobs");
  EXPECT_EQ(jobs_->Cancel(queued)->state(), trainer::v1::JOB_STATE_CANCELLED);
  runner_.End(absl::OkStatus());
  AwaitState(running, trainer::v1::JOB_STATE_SUCCEEDED);
}

}  // namespace
}  // namespace tandem::trainer
