// The job step loop (RunJob) against a scripted fake rollout replica and the real weight-store
// in process on loopback: versions published per step, retries of a step's generation,
// failures, waiting for the replica to swap, cancellation. No other process, no model on the
// rollout side.
#include "services/trainer/job/job_run.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/safetensors.h"
#include "common/testing/http_get.h"
#include "common/testing/test_dir.h"
#include "common/testing/test_server.h"
#include "engine/model.h"
#include "engine/peft_adapter.h"
#include "engine/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/rollout/client/testing/fake_rollout.h"
#include "services/trainer/api/job_spec.h"
#include "services/trainer/api/job_spec_testing.h"
#include "services/weight_store/client/peft_export.h"
#include "services/weight_store/client/testing/weight_store_server.h"

namespace tandem::trainer {
namespace {

using rollout::testing::FakeRolloutState;
using rollout::testing::FakeRolloutStub;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Rollout addresses get the fake; the weight-store address the real store on loopback.
class TestDialer final : public ServiceDialer {
 public:
  TestDialer(FakeRolloutState& rollout, std::shared_ptr<grpc::Channel> weight_store)
      : rollout_(rollout), weight_store_(std::move(weight_store)) {}
  absl::StatusOr<std::unique_ptr<rollout::v1::RolloutService::StubInterface>> Rollout(
      const std::string&) override {
    return std::make_unique<FakeRolloutStub>(rollout_);
  }
  absl::StatusOr<std::unique_ptr<weight_store::WeightStoreStubs>> WeightStore(
      const std::string&) override {
    return std::make_unique<weight_store::WeightStoreStubs>(weight_store_);
  }
  absl::StatusOr<std::unique_ptr<routerreplay::v1::RouterReplayService::StubInterface>>
  RouterReplay(const std::string& address) override {
    return absl::FailedPreconditionError(absl::StrCat("no router-replay in this test: ", address));
  }

 private:
  FakeRolloutState& rollout_;
  std::shared_ptr<grpc::Channel> weight_store_;
};

class JobRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tandem::testing::FreshTestDir("job_run");
    ASSERT_TRUE(engine::BaseModel::Create(engine::DefaultModelConfig(), 3)
                    ->Save(dir_ + "/base.safetensors")
                    .ok());
    ASSERT_TRUE(StartStore(0).ok());
    dialer_ = std::make_unique<TestDialer>(rollout_, store_.Channel());
    environment_.dependencies.dialer = dialer_.get();
    environment_.settings.services = {.rollout = {"rollout:1"}, .weight_store = "weight-store:1"};
    environment_.settings.retry_backoff = absl::Milliseconds(1);
    environment_.settings.swap_timeout = absl::Seconds(10);
  }

  void TearDown() override {
    if (restart_.joinable()) restart_.join();
  }

  // The real weight-store over dir_/weights on loopback, on `port` (0: any).
  absl::Status StartStore(int port) {
    ServerOptions options = tandem::testing::LoopbackOptions();
    options.port = port;
    auto store = weight_store::testing::StartWeightStore(
        {.data_dir = dir_ + "/weights", .enable_ucx = false}, options);
    if (!store.ok()) return store.status();
    store_ = *std::move(store);
    return absl::OkStatus();
  }

  // A resolved job: `steps` GRPO steps of 2 prompts x 2 samples, no routing replay.
  trainer::v1::Job Job(int steps,
                       trainer::v1::Algorithm algorithm = trainer::v1::ALGORITHM_GRPO) const {
    trainer::v1::JobSpec spec = MinimalValidSpec();
    spec.set_algorithm(algorithm);
    spec.set_base_model_path(dir_ + "/base.safetensors");
    spec.set_num_steps(steps);
    spec.set_prompts_per_step(2);
    spec.set_routing_replay(trainer::v1::ROUTING_REPLAY_MODE_OFF);
    trainer::v1::Job job;
    job.set_id("job-test");
    *job.mutable_spec() = *ResolveJobSpec(spec, job.id(), dir_ + "/out");
    return job;
  }

  // Runs the job; the fake replica learns each published version from on_published.
  absl::Status Run(const trainer::v1::Job& job, const std::atomic<bool>& cancelled) {
    const JobProgress progress{
        .on_attempt_start = [this](int64_t start_step) { start_steps_.push_back(start_step); },
        .on_published =
            [this](int64_t version) {
              published_.push_back(version);
              absl::MutexLock lock(&rollout_.mutex);
              rollout_.newest_published = version;
            },
        .on_step = [this](const trainer::v1::StepMetrics& metrics) { steps_.push_back(metrics); }};
    return RunJob(job, environment_, progress, cancelled);
  }

  // Runs `job` (checkpointing every step) until its second step's generation, then cancels it:
  // what a trainer stopped after step 1 leaves behind.
  absl::Status RunFirstStep(trainer::v1::Job& job) {
    job.mutable_spec()->set_checkpoint_every(1);
    std::atomic<bool> cancelled{false};
    rollout_.before_generate = [&cancelled](int call, const rollout::v1::GenerateRequest&) {
      if (call == 2) cancelled = true;
    };
    absl::Status status = Run(job, cancelled);
    rollout_.before_generate = nullptr;
    return status;
  }

  std::string Checkpoint() const { return dir_ + "/out/checkpoint.safetensors"; }

  std::vector<int64_t> RequestedVersions() {
    absl::MutexLock lock(&rollout_.mutex);
    std::vector<int64_t> versions;
    for (const auto& request : rollout_.requests) {
      versions.push_back(request.adapter().exact_version());
    }
    return versions;
  }

  std::string dir_;
  tandem::testing::LoopbackServer store_;
  std::thread restart_;
  FakeRolloutState rollout_;
  std::unique_ptr<TestDialer> dialer_;
  JobEnvironment environment_;
  std::vector<int64_t> start_steps_;  // One per run: the step it continued after.
  std::vector<int64_t> published_;
  std::vector<trainer::v1::StepMetrics> steps_;
  std::atomic<bool> not_cancelled_{false};
};

TEST_F(JobRunTest, EachStepGeneratesWithTheCurrentVersionAndPublishesTheNext) {
  const absl::Status status = Run(Job(2), not_cancelled_);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_THAT(published_, ElementsAre(1, 2, 3)) << "the start adapter, then one per step";
  EXPECT_THAT(RequestedVersions(), ElementsAre(1, 2));
  ASSERT_EQ(steps_.size(), 2u);
  EXPECT_EQ(steps_[1].step(), 2);
  EXPECT_EQ(steps_[1].policy_version(), 3);
  EXPECT_EQ(steps_[1].min_rollout_version(), 2);
  EXPECT_DOUBLE_EQ(steps_[1].response_length_mean(), 1.0);
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/out/checkpoint.safetensors"));
  // A second run of the same job resumes from the checkpoint: nothing left but a new version.
  published_.clear();
  ASSERT_TRUE(Run(Job(2), not_cancelled_).ok());
  EXPECT_THAT(published_, ElementsAre(4));
}

// output_dir may hold another job's checkpoint (a reused directory): resuming it would train
// on from someone else's step, or end the new job SUCCEEDED without training.
// Each trainer rank reads its own flags: a rank without router-replay refuses an R3 job rather
// than training it without replay.
TEST_F(JobRunTest, AnR3JobFailsOnARankWithoutRouterReplay) {
  trainer::v1::Job job = Job(1);
  job.mutable_spec()->set_routing_replay(trainer::v1::ROUTING_REPLAY_MODE_R3);
  const std::atomic<bool> cancelled = false;
  const absl::Status status = Run(job, cancelled);
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("--router_replay"));
}

TEST_F(JobRunTest, AJobNeverResumesAnotherJobsCheckpoint) {
  ASSERT_TRUE(Run(Job(2), not_cancelled_).ok());
  trainer::v1::Job other = Job(2);
  other.set_id("job-other");
  steps_.clear();
  published_.clear();
  const absl::Status status = Run(other, not_cancelled_);
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr(dir_ + "/out"));
  EXPECT_THAT(status.message(), HasSubstr("job-test"));
  EXPECT_TRUE(published_.empty());
}

// A replica takes at most 4096 prompts per GenerateRequest (rollout.proto): a larger step is
// sent as several requests, never refused at every step.
TEST_F(JobRunTest, AStepOfMorePromptsThanARequestHoldsIsSentInSeveralRequests) {
  trainer::v1::Job job = Job(1, trainer::v1::ALGORITHM_PPO);
  job.mutable_spec()->set_prompts_per_step(4100);
  job.mutable_spec()->set_group_size(1);
  const absl::Status status = Run(job, not_cancelled_);
  ASSERT_TRUE(status.ok()) << status;
  absl::MutexLock lock(&rollout_.mutex);
  int prompts = 0;
  for (const rollout::v1::GenerateRequest& request : rollout_.requests) {
    EXPECT_LE(request.prompts_size(), rollout::kMaxPromptsPerRequest);
    prompts += request.prompts_size();
  }
  EXPECT_EQ(prompts, 4100);
  ASSERT_EQ(steps_.size(), 1u);
}

// ASYNC generates up to max_staleness steps ahead, each with the newest version published when
// its generation starts: no step trains on samples more than max_staleness versions behind.
TEST_F(JobRunTest, AsyncGenerationRunsUpToMaxStalenessStepsAhead) {
  for (const int staleness : {1, 2}) {
    SCOPED_TRACE(absl::StrCat("max_staleness ", staleness));
    std::filesystem::remove_all(dir_ + "/out");
    {
      absl::MutexLock lock(&rollout_.mutex);
      rollout_.requests.clear();
    }
    steps_.clear();
    published_.clear();
    trainer::v1::Job job = Job(5);
    job.mutable_spec()->set_sync_mode(trainer::v1::SYNC_MODE_ASYNC);
    job.mutable_spec()->set_max_staleness(staleness);
    ASSERT_TRUE(Run(job, not_cancelled_).ok());
    ASSERT_EQ(steps_.size(), 5u);
    // Versions counted from the one the run started from (the store keeps the first run's).
    const int64_t start = published_.front() - 1;
    std::vector<int64_t> generated_with, behind;
    for (const trainer::v1::StepMetrics& step : steps_) {
      generated_with.push_back(step.min_rollout_version() - start);
      behind.push_back(step.policy_version() - 1 - step.min_rollout_version());
    }
    std::vector<int64_t> requested = RequestedVersions();
    for (int64_t& version : requested) version -= start;
    std::sort(requested.begin(), requested.end());
    EXPECT_EQ(requested, generated_with);
    if (staleness == 1) {
      EXPECT_THAT(generated_with, ElementsAre(1, 1, 2, 3, 4));
      EXPECT_THAT(behind, ElementsAre(0, 1, 1, 1, 1));
    } else {
      EXPECT_THAT(generated_with, ElementsAre(1, 1, 1, 2, 3));
      EXPECT_THAT(behind, ElementsAre(0, 1, 2, 2, 2));
    }
  }
}

// A generation running ahead holds a weight-store lease on the version it asks for, so that
// publishing ahead cannot retire it under a retry; the leases go with their steps.
TEST_F(JobRunTest, GenerationsAheadPinTheirVersionInTheWeightStore) {
  const auto active_leases = [this] {
    auto page = tandem::testing::HttpGet(
        absl::StrCat("http://127.0.0.1:", store_.server->metrics_port(), "/metrics"));
    const std::string key = "\ntandem_weight_store_active_leases ";
    const size_t at = page.ok() ? page->find(key) : std::string::npos;
    return at == std::string::npos ? -1 : std::atoi(page->c_str() + at + key.size());
  };
  std::atomic<int> most_leases_while_ahead = 0;
  rollout_.before_generate = [&](int call, const rollout::v1::GenerateRequest&) {
    if (call >= 2)
      most_leases_while_ahead = std::max(most_leases_while_ahead.load(), active_leases());
  };
  trainer::v1::Job job = Job(4);
  job.mutable_spec()->set_sync_mode(trainer::v1::SYNC_MODE_ASYNC);
  job.mutable_spec()->set_max_staleness(2);
  ASSERT_TRUE(Run(job, not_cancelled_).ok());
  EXPECT_GE(most_leases_while_ahead.load(), 1);
  EXPECT_EQ(active_leases(), 0);
}

// With partial_rollouts, generation asks for version switches, and a sample that finished on a
// newer version than it started with counts in the step's partial_rollout_share. The replica
// holds each step's generation until the trainer has published the version after the one asked
// for, as a generation that overlaps a publish sees it.
TEST_F(JobRunTest, PartialRolloutsSwitchToVersionsPublishedWhileGenerating) {
  rollout_.before_generate = [this](int call, const rollout::v1::GenerateRequest& request) {
    if (call < 2) return;
    absl::MutexLock lock(&rollout_.mutex);
    const int64_t wanted = request.adapter().exact_version() + 1;
    const auto published = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(rollout_.mutex) {
      return rollout_.newest_published >= wanted;
    };
    rollout_.mutex.AwaitWithTimeout(absl::Condition(&published), absl::Seconds(10));
  };
  trainer::v1::Job job = Job(3);
  job.mutable_spec()->set_sync_mode(trainer::v1::SYNC_MODE_ASYNC);
  job.mutable_spec()->set_max_staleness(1);
  job.mutable_spec()->set_partial_rollouts(true);
  ASSERT_TRUE(Run(job, not_cancelled_).ok());
  {
    absl::MutexLock lock(&rollout_.mutex);
    for (const rollout::v1::GenerateRequest& request : rollout_.requests) {
      EXPECT_TRUE(request.allow_version_switch());
    }
  }
  ASSERT_EQ(steps_.size(), 3u);
  EXPECT_EQ(steps_[0].partial_rollout_share(), 0);  // Generated before anything else published.
  EXPECT_EQ(steps_[1].partial_rollout_share(), 1);
  EXPECT_EQ(steps_[2].partial_rollout_share(), 1);
}

// Warmup over 2 updates, then linear decay to half the rate at the last of 4 (one per step).
TEST_F(JobRunTest, EachStepReportsTheLearningRateOfItsSchedule) {
  trainer::v1::Job job = Job(4);
  const double peak = job.spec().algorithm_config().learning_rate();
  trainer::v1::LearningRateSchedule& schedule =
      *job.mutable_spec()->mutable_algorithm_config()->mutable_lr_schedule();
  schedule.set_warmup_updates(2);
  schedule.set_decay(trainer::v1::LR_DECAY_LINEAR);
  schedule.set_min_lr_ratio(0.5);
  ASSERT_TRUE(Run(job, not_cancelled_).ok());
  ASSERT_EQ(steps_.size(), 4u);
  const double expected[] = {0.5, 1.0, 1.0, 0.75};
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(steps_[i].learning_rate(), expected[i] * peak, 1e-6 * peak) << "step " << i + 1;
  }
}

TEST_F(JobRunTest, AWeightStoreRestartDuringAStepCostsRetriesNotTheJob) {
  // While step 2 generates, the store goes down; it comes back (same port, same data) 300 ms
  // later, after the step has tried to publish.
  rollout_.before_generate = [this](int call, const rollout::v1::GenerateRequest&) {
    if (call != 2) return;
    const int port = store_.server->port();
    store_.server.reset();
    restart_ = std::thread([this, port] {
      absl::SleepFor(absl::Milliseconds(300));
      EXPECT_TRUE(StartStore(port).ok());
    });
  };
  environment_.settings.store_outage_budget = absl::Seconds(30);
  const absl::Status status = Run(Job(2), not_cancelled_);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_THAT(published_, ElementsAre(1, 2, 3));
}

TEST_F(JobRunTest, AStoreDownLongerThanTheOutageBudgetFailsTheJobNamingIt) {
  rollout_.before_generate = [this](int call, const rollout::v1::GenerateRequest&) {
    if (call == 1) store_.server.reset();
  };
  environment_.settings.store_outage_budget = absl::Milliseconds(200);
  const absl::Status status = Run(Job(1), not_cancelled_);
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("weight-store unavailable for"));
  EXPECT_THAT(status.message(), HasSubstr("outage budget 200ms"));
}

TEST_F(JobRunTest, ACancelDuringAStoreOutageEndsTheRunCancelled) {
  std::atomic<bool> cancelled{false};
  rollout_.before_generate = [this, &cancelled](int call, const rollout::v1::GenerateRequest&) {
    if (call != 1) return;
    store_.server.reset();  // Down for good: only the cancel can end the wait.
    restart_ = std::thread([&cancelled] {
      absl::SleepFor(absl::Milliseconds(200));
      cancelled = true;
    });
  };
  environment_.settings.store_outage_budget = absl::Minutes(10);
  const absl::Status status = Run(Job(2), cancelled);
  EXPECT_TRUE(absl::IsCancelled(status)) << status;
}

TEST_F(JobRunTest, AnUnavailableReplicaCostsRetriesWithNewAttemptNumbers) {
  {
    absl::MutexLock lock(&rollout_.mutex);
    rollout_.unavailable_calls = 2;
    rollout_.draining_calls = 1;
  }
  ASSERT_TRUE(Run(Job(1), not_cancelled_).ok());
  absl::MutexLock lock(&rollout_.mutex);
  ASSERT_EQ(rollout_.requests.size(), 4u);
  for (size_t attempt = 0; attempt < rollout_.requests.size(); ++attempt) {
    EXPECT_THAT(rollout_.requests[attempt].request_id(), HasSubstr(absl::StrCat("-a", attempt)));
  }
}

TEST_F(JobRunTest, AReplicaUnavailableForEveryAttemptFailsTheJob) {
  environment_.settings.generate_attempts = 3;
  {
    absl::MutexLock lock(&rollout_.mutex);
    rollout_.unavailable_calls = 3;
  }
  const absl::Status status = Run(Job(1), not_cancelled_);
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("restarting"));
}

TEST_F(JobRunTest, AFailedSampleFailsTheStepWithItsMessage) {
  {
    absl::MutexLock lock(&rollout_.mutex);
    rollout_.error_sample = true;
  }
  const absl::Status status = Run(Job(1), not_cancelled_);
  EXPECT_TRUE(absl::IsInternal(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("kernel fault"));
}

TEST_F(JobRunTest, TheStepWaitsForTheReplicaToServeTheNewVersion) {
  {
    absl::MutexLock lock(&rollout_.mutex);
    rollout_.swap_after_polls = 3;
  }
  ASSERT_TRUE(Run(Job(1), not_cancelled_).ok());
  ASSERT_EQ(steps_.size(), 1u);
  EXPECT_GT(steps_[0].swap_seconds(), 0);
}

TEST_F(JobRunTest, AReplicaThatNeverSwapsFailsTheStepNamingItsLastError) {
  environment_.settings.swap_timeout = absl::Milliseconds(100);
  {
    absl::MutexLock lock(&rollout_.mutex);
    rollout_.never_swaps = true;
  }
  const absl::Status status = Run(Job(1), not_cancelled_);
  EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("still loading"));
}

TEST_F(JobRunTest, ANonFiniteLossFailsTheStepBeforeAnythingIsPublished) {
  {
    absl::MutexLock lock(&rollout_.mutex);
    rollout_.nan_logprobs = true;  // Through token TIS weights into the loss.
  }
  trainer::v1::Job job = Job(2);
  job.mutable_spec()->mutable_is_correction()->set_mode(trainer::v1::IS_CORRECTION_MODE_TOKEN_TIS);
  const absl::Status status = Run(job, not_cancelled_);
  EXPECT_TRUE(absl::IsInternal(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("step 1: loss nan"));
  EXPECT_THAT(published_, ElementsAre(1)) << "only the starting adapter";
  EXPECT_TRUE(steps_.empty());
}

// Sampling's vocabulary rules are checked against the base model once it is loaded: before any
// step runs or anything is published.
TEST_F(JobRunTest, SamplingBeyondTheBaseModelsVocabularyFailsBeforeTheFirstStep) {
  trainer::v1::Job job = Job(1);
  job.mutable_spec()->mutable_sampling()->set_top_k(engine::kVocabSize + 1);
  const absl::Status status = Run(job, not_cancelled_);
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat("spec.sampling.top_k is ", engine::kVocabSize + 1)));
  EXPECT_THAT(status.message(), HasSubstr("the base model's vocabulary"));
  EXPECT_TRUE(published_.empty());
  EXPECT_TRUE(steps_.empty());
}

TEST_F(JobRunTest, ACorruptCheckpointIsRefusedNamingTheTensor) {
  ASSERT_TRUE(Run(Job(1), not_cancelled_).ok());
  const std::string checkpoint = dir_ + "/out/checkpoint.safetensors";
  // Tensor data, not the header.
  ASSERT_TRUE(tandem::testing::FlipByte(checkpoint, -16, std::ios::end));
  const absl::Status status = Run(Job(2), not_cancelled_);
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("is corrupt (xxh3"));
  EXPECT_THAT(status.message(), HasSubstr("tensor "));
}

// PPO's value head lives in the trainer: checkpointed beside the adapter and restored on resume.
TEST_F(JobRunTest, APpoJobCheckpointsItsValueHeadAndResumesWithIt) {
  trainer::v1::Job job = Job(2, trainer::v1::ALGORITHM_PPO);
  job.mutable_spec()->set_group_size(1);  // PPO needs no groups.
  ASSERT_TRUE(absl::IsCancelled(RunFirstStep(job)));
  ASSERT_EQ(steps_.size(), 1u);
  EXPECT_TRUE(std::isfinite(steps_[0].value_loss()));
  absl::StatusOr<SafetensorsFile> checkpoint = ReadSafetensors(Checkpoint());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  ASSERT_TRUE(checkpoint->tensors.contains("critic/head/value_head.weight"));
  EXPECT_EQ(checkpoint->tensors.at("critic/head/value_head.weight").num_elements(),
            engine::DefaultModelConfig().d_model);
  EXPECT_TRUE(checkpoint->tensors.contains("critic/optimizer/value_head.bias.exp_avg"));
  published_.clear();
  const absl::Status resumed = Run(job, not_cancelled_);
  ASSERT_TRUE(resumed.ok()) << resumed;
  EXPECT_THAT(start_steps_, ElementsAre(0, 1));
  EXPECT_THAT(published_, ElementsAre(3, 4));
}

TEST_F(JobRunTest, APpoJobRefusesItsCheckpointWithoutAValueHead) {
  trainer::v1::Job job = Job(2, trainer::v1::ALGORITHM_PPO);
  job.mutable_spec()->set_group_size(1);
  ASSERT_TRUE(absl::IsCancelled(RunFirstStep(job)));
  absl::StatusOr<SafetensorsFile> checkpoint = ReadSafetensors(Checkpoint());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  std::erase_if(checkpoint->tensors,
                [](const auto& entry) { return entry.first.starts_with("critic/"); });
  ASSERT_TRUE(WriteSafetensors(Checkpoint(), *checkpoint).ok());
  const absl::Status status = Run(job, not_cancelled_);
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_EQ(status.message(), "checkpoint of a PPO job holds no value head");
}

// A job may start from another job's checkpoint when its spec names it: an initialization at
// step 0 with that adapter and optimizer state, recorded in its own checkpoints.
TEST_F(JobRunTest, AJobStartsFromTheCheckpointItsSpecNames) {
  ASSERT_TRUE(Run(Job(1), not_cancelled_).ok());
  trainer::v1::Job other = Job(1);
  other.set_id("job-other");
  other.mutable_spec()->set_output_dir(dir_ + "/other");
  other.mutable_spec()->set_initial_checkpoint_dir(dir_ + "/out");
  start_steps_.clear();
  const absl::Status status = Run(other, not_cancelled_);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_THAT(start_steps_, ElementsAre(0));
  absl::StatusOr<std::map<std::string, std::string>> metadata =
      ReadSafetensorsMetadata(dir_ + "/other/checkpoint.safetensors");
  ASSERT_TRUE(metadata.ok()) << metadata.status();
  EXPECT_EQ(metadata->at("tandem.job_id"), "job-other");
  EXPECT_EQ(metadata->at("tandem.initialized_from"), "job-test");
  EXPECT_EQ(metadata->at("tandem.optimizer_step"), "2") << "job-test's update, then its own";
}

// Naming the checkpoint in output_dir itself hands the directory over: the new job starts from
// it, then resumes only its own.
TEST_F(JobRunTest, AJobStartingFromTheCheckpointInItsOutputDirThenResumesItsOwn) {
  ASSERT_TRUE(Run(Job(1), not_cancelled_).ok());
  trainer::v1::Job other = Job(1);
  other.set_id("job-other");
  other.mutable_spec()->set_initial_checkpoint_dir(dir_ + "/out");
  start_steps_.clear();
  ASSERT_TRUE(Run(other, not_cancelled_).ok());
  ASSERT_TRUE(Run(other, not_cancelled_).ok());
  EXPECT_THAT(start_steps_, ElementsAre(0, 1));
  const absl::Status original = Run(Job(1), not_cancelled_);
  EXPECT_TRUE(absl::IsFailedPrecondition(original)) << original;
  EXPECT_THAT(original.message(), HasSubstr("job job-other"));
}

// A checkpoint an earlier trainer wrote names no job: the job whose output_dir holds it (only
// one created before owner records can have one there) resumes it.
TEST_F(JobRunTest, ACheckpointThatNamesNoJobIsResumedAsTheJobsOwn) {
  trainer::v1::Job job = Job(2);
  ASSERT_TRUE(absl::IsCancelled(RunFirstStep(job)));
  absl::StatusOr<SafetensorsFile> checkpoint = ReadSafetensors(Checkpoint());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  checkpoint->metadata.erase("tandem.job_id");
  checkpoint->metadata.erase("tandem.spec_fingerprint");
  ASSERT_TRUE(WriteSafetensors(Checkpoint(), *checkpoint).ok());
  const absl::Status status = Run(job, not_cancelled_);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_THAT(start_steps_, ElementsAre(0, 1));
}

TEST_F(JobRunTest, AnInitialCheckpointOfAnotherLoraIsRefusedNamingBoth) {
  ASSERT_TRUE(Run(Job(1), not_cancelled_).ok());
  trainer::v1::Job other = Job(1);
  other.set_id("job-other");
  other.mutable_spec()->set_output_dir(dir_ + "/other");
  other.mutable_spec()->set_initial_checkpoint_dir(dir_ + "/out");
  other.mutable_spec()->mutable_lora()->set_rank(8);
  const absl::Status status = Run(other, not_cancelled_);
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("initial_checkpoint_dir " + dir_ + "/out"));
}

TEST_F(JobRunTest, ACancelledRunStopsBeforeItsNextPhase) {
  std::atomic<bool> cancelled{true};
  const absl::Status status = Run(Job(3), cancelled);
  EXPECT_TRUE(absl::IsCancelled(status)) << status;
  EXPECT_TRUE(steps_.empty());
}

// Export a version as PEFT (what `tandem-cli export` does), start a new job from it: the new
// job's first version is that adapter.
TEST_F(JobRunTest, AJobStartsFromAnExportedPeftAdapter) {
  ASSERT_TRUE(Run(Job(1), not_cancelled_).ok());
  auto store = std::make_unique<weight_store::WeightStoreStubs>(store_.Channel());
  const std::string peft = dir_ + "/peft";
  ASSERT_TRUE(weight_store::ExportPeftAdapter(*store, "job-test", 2, peft, "base").ok());

  trainer::v1::Job second = Job(1);
  second.set_id("job-two");
  second.mutable_spec()->set_adapter_name("job-two");
  second.mutable_spec()->set_output_dir(dir_ + "/out2");
  second.mutable_spec()->set_initial_adapter_path(peft);
  published_.clear();
  ASSERT_TRUE(Run(second, not_cancelled_).ok());
  ASSERT_THAT(published_, ElementsAre(1, 2));
  ASSERT_TRUE(weight_store::ExportPeftAdapter(*store, "job-two", 1, dir_ + "/start", "base").ok());
  const engine::ModelConfig model = engine::DefaultModelConfig();
  auto exported = engine::ReadPeftAdapter(peft, model);
  auto started = engine::ReadPeftAdapter(dir_ + "/start", model);
  ASSERT_TRUE(exported.ok() && started.ok()) << exported.status() << started.status();
  for (const std::string& name : exported->parameters().names()) {
    EXPECT_EQ(started->parameters().Find(name)->value, exported->parameters().Find(name)->value)
        << name;
  }

  // A spec whose LoRA differs from the adapter's fails the job before anything is published.
  second.set_id("job-three");
  second.mutable_spec()->set_adapter_name("job-three");
  second.mutable_spec()->set_output_dir(dir_ + "/out3");
  second.mutable_spec()->mutable_lora()->set_rank(second.spec().lora().rank() + 1);
  published_.clear();
  const absl::Status status = Run(second, not_cancelled_);
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("initial adapter"));
  EXPECT_TRUE(published_.empty());
}

TEST_F(JobRunTest, AMissingBaseModelFailsBeforeAnythingIsPublished) {
  trainer::v1::Job job = Job(1);
  job.mutable_spec()->set_base_model_path(dir_ + "/nope.safetensors");
  const absl::Status status = Run(job, not_cancelled_);
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("base model"));
  EXPECT_TRUE(published_.empty());
}

}  // namespace
}  // namespace tandem::trainer
