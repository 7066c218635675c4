// The scheduler with no model: a fake batch that "generates" token t+1 after token t, and fake
// served models. Each test steps the scheduler by hand (RunStep), so admission, budgets,
// cancellation, drain and version switches are checked step by step, deterministically.
#include "services/rollout/scheduler.h"

#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/testing/simulated_clock.h"
#include "engine/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/router_replay/client/testing/fake_route_sink.h"

namespace tandem::rollout {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kBytesPerPosition = 10;

// Sequences whose every step appends last token + 1; one finishes after max_new_tokens
// (LENGTH) or on a stop token (STOP). Records which model each step ran on. A finished sample
// carries routes as the engine captures them: one row per forwarded position (prompt +
// generated − 1), row r's ids RouteId(r, j).
class FakeBatch final : public SequenceBatch {
 public:
  explicit FakeBatch(int64_t route_ids_per_row) : route_ids_per_row_(route_ids_per_row) {}

  static int16_t RouteId(int64_t row, int64_t j) { return static_cast<int16_t>((row * 7 + j) % 8); }

  struct Sequence {
    engine::GenerationRequest request;
    engine::GeneratedSample sample;
    const ServedModel* model = nullptr;
  };

  std::vector<absl::StatusOr<int>> Admit(const std::vector<SampleToAdmit>& samples) override {
    ++admissions_;
    std::vector<absl::StatusOr<int>> ids;
    for (const SampleToAdmit& sample : samples) ids.push_back(AdmitOne(sample));
    return ids;
  }
  int Switch(int id, const ServedModel& model) override {
    auto found = sequences_.find(id);
    if (found == sequences_.end()) return -1;
    found->second.model = &model;
    return static_cast<int>(found->second.sample.logprobs.size());
  }
  void Step() override {
    ++steps_;
    std::vector<int> ids;
    for (const auto& [id, sequence] : sequences_) ids.push_back(id);
    for (int id : ids) {
      if (fault_.empty()) {
        Generate(id);
        continue;
      }
      engine::GeneratedSample& sample = sequences_.at(id).sample;
      sample.finish_reason = engine::FinishReason::kError;
      sample.error = fault_;
      Finish(id);
    }
  }
  // The next steps fail as the engine does on a device fault: every sequence ends with `error`.
  void FailSteps(std::string error) { fault_ = std::move(error); }
  // Admitting a prompt that starts with `token` fails, as on a device out of memory.
  void FailAdmitsOf(int token) { failing_prompt_token_ = token; }
  std::vector<std::pair<int, engine::GeneratedSample>> TakeFinished() override {
    return std::exchange(finished_, {});
  }
  void Cancel(int id) override {
    sequences_.erase(id);
    cancelled_.push_back(id);
  }
  bool Stop(int id) override {
    auto found = sequences_.find(id);
    if (found == sequences_.end()) return false;
    found->second.sample.finish_reason = engine::FinishReason::kCancelled;
    Finish(id);
    return true;
  }
  int active() const override { return static_cast<int>(sequences_.size()); }
  int64_t kv_cache_bytes() const override {
    int64_t bytes = 0;
    for (const auto& [id, sequence] : sequences_) {
      bytes += ReservedBytes(static_cast<int64_t>(sequence.request.prompt.size()) +
                             sequence.request.max_new_tokens);
    }
    return bytes;
  }
  int64_t ReservedBytes(int64_t positions) const override { return positions * kBytesPerPosition; }

  int steps() const { return steps_; }
  // Calls of Admit: each admits what one scheduler step could take.
  int admissions() const { return admissions_; }
  const std::vector<int>& cancelled() const { return cancelled_; }

 private:
  absl::StatusOr<int> AdmitOne(const SampleToAdmit& admitted) {
    const engine::GenerationRequest& request = admitted.request;
    if (!request.prompt.empty() && request.prompt[0] == failing_prompt_token_) {
      return absl::ResourceExhaustedError("out of device memory for the KV cache");
    }
    const int id = next_id_++;
    Sequence& sequence = sequences_[id];
    sequence.request = request;
    sequence.model = admitted.model;
    sequence.sample.tokens = request.prompt;
    sequence.sample.prompt_length = static_cast<int>(request.prompt.size());
    Generate(id);  // Prefill samples the first token, as the engine does.
    return id;
  }

  void Generate(int id) {
    Sequence& sequence = sequences_.at(id);
    const int token = sequence.sample.tokens.back() + 1;
    sequence.sample.tokens.push_back(token);
    sequence.sample.logprobs.push_back(-0.5f);
    const auto& stops = sequence.request.stop_tokens;
    if (std::find(stops.begin(), stops.end(), token) != stops.end()) {
      sequence.sample.finish_reason = engine::FinishReason::kStop;
      Finish(id);
    } else if (static_cast<int>(sequence.sample.logprobs.size()) >=
               sequence.request.max_new_tokens) {
      sequence.sample.finish_reason = engine::FinishReason::kLength;
      Finish(id);
    }
  }
  void Finish(int id) {
    engine::GeneratedSample& sample = sequences_.at(id).sample;
    const int64_t rows = static_cast<int64_t>(sample.tokens.size()) - 1;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < route_ids_per_row_; ++j) sample.routes.push_back(RouteId(r, j));
    }
    finished_.emplace_back(id, std::move(sample));
    sequences_.erase(id);
  }

  const int64_t route_ids_per_row_;
  int next_id_ = 0;
  int steps_ = 0;
  int admissions_ = 0;
  std::string fault_;
  int failing_prompt_token_ = -1;
  std::map<int, Sequence> sequences_;
  std::vector<std::pair<int, engine::GeneratedSample>> finished_;
  std::vector<int> cancelled_;
};

// The base model and, per adapter, its current version; a request for an adapter with no
// version waits, one for "missing" is NOT_FOUND.
class FakeModels final : public ServedModels {
 public:
  FakeModels() : base_(std::make_shared<ServedModel>()) {}

  std::shared_ptr<ServedModel> Publish(const std::string& adapter, int64_t version) {
    auto model = std::make_shared<ServedModel>();
    model->adapter = adapter;
    model->version = version;
    current_[adapter] = model;
    return model;
  }

  int PromoteStaged() override { return 0; }
  absl::StatusOr<std::shared_ptr<ServedModel>> TryResolve(
      const type::v1::AdapterSelector& selector) override {
    if (selector.adapter_name().empty()) return base_;
    if (selector.adapter_name() == "missing") return absl::NotFoundError("no adapter 'missing'");
    return Current(selector.adapter_name());
  }
  std::shared_ptr<ServedModel> Current(const std::string& adapter) const override {
    auto found = current_.find(adapter);
    return found == current_.end() ? nullptr : found->second;
  }

 private:
  std::shared_ptr<ServedModel> base_;
  std::map<std::string, std::shared_ptr<ServedModel>> current_;
};

// What a request's client received.
struct Outcome {
  absl::Mutex mutex;
  std::vector<SampleOutput> samples ABSL_GUARDED_BY(mutex);
  std::optional<absl::Status> failure ABSL_GUARDED_BY(mutex);
};

class SchedulerTest : public ::testing::Test {
 protected:
  // `routes`: where recorded routes go (null: no router-replay).
  void Start(SchedulerOptions options, router_replay::RouteSink* routes = nullptr) {
    auto batch = std::make_unique<FakeBatch>(RouteShapeOfModel().ids_per_row());
    batch_ = batch.get();
    scheduler_ = std::make_unique<Scheduler>(models_, std::move(batch), routes,
                                             engine::DefaultModelConfig(), options);
  }

  static router_replay::RouteShape RouteShapeOfModel() {
    const engine::ModelConfig model = engine::DefaultModelConfig();
    return {model.MoeLayerIndices(), model.top_k, model.num_experts};
  }

  // A request recording its routes for job-1.
  std::shared_ptr<GenerationWork> RecordingWork(const std::string& id, int prompts, int group,
                                                Outcome& outcome) {
    auto work = Work(id, prompts, group, /*prompt_length=*/2, /*max_new_tokens=*/3, outcome);
    work->routes = {.enabled = true, .job_id = "job-1"};
    return work;
  }

  // Steps until the requests submitted so far have run to the end.
  void RunUntilIdle() {
    do {
      scheduler_->RunStep();
    } while (batch_->active() > 0);
  }

  // A request of `prompts` prompts of `prompt_length` tokens, `group` samples each.
  std::shared_ptr<GenerationWork> Work(const std::string& id, int prompts, int group,
                                       int prompt_length, int max_new_tokens, Outcome& outcome) {
    auto work = std::make_shared<GenerationWork>();
    work->request_id = id;
    work->group_size = group;
    work->start = absl::Now();
    work->sample_template.max_new_tokens = max_new_tokens;
    for (int p = 0; p < prompts; ++p) {
      work->prompt_ids.push_back(absl::StrCat("p", p));
      work->prompts.emplace_back(prompt_length, 10 * (p + 1));
      work->text_prompts.push_back(false);
      work->reserved_positions += int64_t{group} * (prompt_length + max_new_tokens);
    }
    work->deliver = [&outcome](SampleOutput output) {
      absl::MutexLock lock(&outcome.mutex);
      outcome.samples.push_back(std::move(output));
    };
    work->fail = [&outcome](absl::Status status) {
      absl::MutexLock lock(&outcome.mutex);
      outcome.failure = std::move(status);
    };
    return work;
  }

  absl::Status Submit(std::shared_ptr<GenerationWork> work) {
    absl::Duration retry_after;
    return scheduler_->Submit(std::move(work), &retry_after);
  }

  // Submits a request whose id a finished request held: the delivery thread frees the id
  // right after handing over that request's last sample, so a client may see the sample first.
  absl::Status SubmitOnceTheIdIsFree(const std::function<std::shared_ptr<GenerationWork>()>& work) {
    absl::Status submitted;
    for (int i = 0; i < 1000; ++i) {
      submitted = Submit(work());
      if (!absl::IsAlreadyExists(submitted)) break;
      absl::SleepFor(absl::Milliseconds(1));
    }
    return submitted;
  }

  // Waits for the delivery thread to hand over `count` samples.
  static std::vector<SampleOutput> AwaitSamples(Outcome& outcome, size_t count) {
    absl::MutexLock lock(&outcome.mutex);
    const auto done = [&] {
      outcome.mutex.AssertHeld();
      return outcome.samples.size() >= count;
    };
    outcome.mutex.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(10));
    return outcome.samples;
  }

  static std::optional<absl::Status> Failure(Outcome& outcome) {
    absl::MutexLock lock(&outcome.mutex);
    return outcome.failure;
  }

  // What clients received; declared before the scheduler, which may still call them while it
  // shuts down.
  Outcome& NewOutcome() { return outcomes_.emplace_back(); }

  std::list<Outcome> outcomes_;
  router_replay::testing::FakeRouteSink routes_;
  FakeModels models_;
  tandem::testing::SimulatedClock clock_;  // Where a test gives it to the scheduler.
  FakeBatch* batch_ = nullptr;
  std::unique_ptr<Scheduler> scheduler_;
};

TEST_F(SchedulerTest, AdmitsFifoWithinTheKvBudgetAndRunsEverySampleToTheEnd) {
  // Each sample reserves (2 + 3) positions = 50 bytes; the budget holds two.
  Start({.kv_cache_bytes = 100});
  Outcome& outcome = NewOutcome();
  ASSERT_TRUE(Submit(Work("r", /*prompts=*/3, /*group=*/1, 2, 3, outcome)).ok());
  scheduler_->RunStep();
  EXPECT_EQ(batch_->active(), 2) << "the third sample waits for KV cache";
  EXPECT_EQ(batch_->admissions(), 1) << "a step admits what fits together: one prefill";
  scheduler_->RunStep();
  scheduler_->RunStep();  // The first two reach 3 tokens and leave; the third is admitted.
  EXPECT_EQ(batch_->active(), 1);
  while (batch_->active() > 0) scheduler_->RunStep();
  const std::vector<SampleOutput> samples = AwaitSamples(outcome, 3);
  ASSERT_EQ(samples.size(), 3u);
  for (const SampleOutput& sample : samples) {
    const int first = 10 * (sample.sample + 1) + 1;  // Groups of one: sample s is prompt s.
    EXPECT_THAT(sample.tokens, ElementsAre(first, first + 1, first + 2));
    EXPECT_EQ(sample.finish_reason, engine::FinishReason::kLength);
    EXPECT_EQ(sample.routes, RouteOutcome::kNotRequested);
  }
  EXPECT_FALSE(Failure(outcome).has_value());
  // The id is free again once every sample is out.
  Outcome& again = NewOutcome();
  EXPECT_TRUE(SubmitOnceTheIdIsFree([&] { return Work("r", 1, 1, 2, 1, again); }).ok());
}

// A sample the engine ended with an error reaches its client as FINISH_REASON_ERROR with the
// engine's message and the tokens it had (the trainer fails the step rather than retrying).
TEST_F(SchedulerTest, AnEngineFaultEndsSamplesWithAnError) {
  Start({});
  Outcome& outcome = NewOutcome();
  ASSERT_TRUE(Submit(Work("r", 1, 1, 2, 5, outcome)).ok());
  scheduler_->RunStep();
  batch_->FailSteps("INTERNAL: device fault");
  scheduler_->RunStep();
  const std::vector<SampleOutput> samples = AwaitSamples(outcome, 1);
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(samples[0].finish_reason, engine::FinishReason::kError);
  EXPECT_EQ(samples[0].error, "INTERNAL: device fault");
  EXPECT_EQ(samples[0].tokens.size(), 2u) << "prefill's token and the first step's";
}

// A sample the engine cannot admit is that sample's failure, answered FINISH_REASON_ERROR in
// its own message; the request's other samples run and the call ends OK.
TEST_F(SchedulerTest, ASampleThatCannotBeAdmittedFailsAloneInItsMessage) {
  Start({});
  batch_->FailAdmitsOf(20);  // Prompt 1's tokens.
  Outcome& outcome = NewOutcome();
  ASSERT_TRUE(Submit(Work("r", /*prompts=*/3, /*group=*/2, 2, 3, outcome)).ok());
  for (int step = 0; step < 8; ++step) scheduler_->RunStep();
  const std::vector<SampleOutput> samples = AwaitSamples(outcome, 6);
  ASSERT_EQ(samples.size(), 6u);
  for (const SampleOutput& sample : samples) {
    if (sample.sample / 2 == 1) {  // Prompt 1's.
      EXPECT_EQ(sample.finish_reason, engine::FinishReason::kError);
      EXPECT_THAT(sample.error, HasSubstr("admit failed: out of device memory"));
      EXPECT_TRUE(sample.tokens.empty());
      EXPECT_EQ(sample.routes, RouteOutcome::kNotRequested);
    } else {
      EXPECT_EQ(sample.finish_reason, engine::FinishReason::kLength);
      EXPECT_EQ(sample.tokens.size(), 3u);
    }
  }
  absl::MutexLock lock(&outcome.mutex);
  EXPECT_FALSE(outcome.failure.has_value()) << *outcome.failure;
}

// A request's id stays in flight until its last sample is handed over (delivery may wait for
// route acknowledgements): a second Generate with the id meanwhile is ALREADY_EXISTS.
TEST_F(SchedulerTest, ARequestIdStaysInFlightUntilItsLastSampleIsDelivered) {
  Start({});
  Outcome& outcome = NewOutcome();
  std::shared_ptr<GenerationWork> work = Work("r", 1, 1, 2, 1, outcome);
  absl::Notification delivering, release;
  work->deliver = [&, deliver = work->deliver](SampleOutput output) {
    delivering.Notify();
    release.WaitForNotification();
    deliver(std::move(output));
  };
  ASSERT_TRUE(Submit(work).ok());
  scheduler_->RunStep();  // Its one token comes with the prefill: the sample is finished.
  delivering.WaitForNotification();
  Outcome& again = NewOutcome();
  EXPECT_TRUE(absl::IsAlreadyExists(Submit(Work("r", 1, 1, 2, 1, again))));
  release.Notify();
  ASSERT_EQ(AwaitSamples(outcome, 1).size(), 1u);
  const absl::Status resubmitted =
      SubmitOnceTheIdIsFree([&] { return Work("r", 1, 1, 2, 1, again); });
  EXPECT_TRUE(resubmitted.ok()) << resubmitted;
}

TEST_F(SchedulerTest, PrefillBudgetAdmitsOnePromptPerStepAndAlwaysAtLeastOne) {
  Start({.max_prefill_tokens_per_step = 4});
  Outcome& outcome = NewOutcome();
  ASSERT_TRUE(Submit(Work("r", 3, 1, /*prompt_length=*/6, 5, outcome)).ok());
  scheduler_->RunStep();
  EXPECT_EQ(batch_->active(), 1) << "a prompt over the budget is still admitted alone";
  scheduler_->RunStep();
  EXPECT_EQ(batch_->active(), 2);
}

TEST_F(SchedulerTest, SubmitRefusesDuplicatesOversizedSamplesAndAFullQueue) {
  Start({.kv_cache_bytes = 100, .max_queued_positions = 12});
  Outcome& first = NewOutcome();
  Outcome& second = NewOutcome();
  Outcome& third = NewOutcome();
  Outcome& fourth = NewOutcome();
  ASSERT_TRUE(Submit(Work("a", 1, 1, 2, 3, first)).ok());
  EXPECT_TRUE(absl::IsAlreadyExists(Submit(Work("a", 1, 1, 2, 3, second))));
  const absl::Status too_big = Submit(Work("b", 1, 1, 2, 9, second));  // 110 bytes > 100.
  EXPECT_TRUE(absl::IsInvalidArgument(too_big)) << too_big;
  EXPECT_THAT(too_big.message(), HasSubstr("--kv_cache_mib"));
  absl::Duration retry_after;
  const absl::Status full = scheduler_->Submit(Work("c", 2, 1, 2, 3, third), &retry_after);
  EXPECT_TRUE(absl::IsResourceExhausted(full)) << full;
  EXPECT_THAT(full.message(), HasSubstr("retry in"));
  EXPECT_GE(retry_after, absl::Milliseconds(100));
  scheduler_->Drain();
  EXPECT_TRUE(absl::IsUnavailable(Submit(Work("d", 1, 1, 2, 3, fourth))));
}

TEST_F(SchedulerTest, ACancelledRequestFreesItsKvCacheAtTheNextStep) {
  Start({.kv_cache_bytes = 100});
  Outcome& cancelled = NewOutcome();
  Outcome& waiting = NewOutcome();
  auto work = Work("gone", 2, 1, 2, 8, cancelled);  // 100 bytes each: one at a time.
  ASSERT_TRUE(Submit(work).ok());
  scheduler_->RunStep();
  ASSERT_TRUE(Submit(Work("next", 1, 1, 2, 3, waiting)).ok());
  scheduler_->RunStep();
  EXPECT_EQ(batch_->active(), 1);
  work->cancelled = true;
  scheduler_->RunStep();
  EXPECT_EQ(batch_->cancelled().size(), 1u) << "its running sample left the batch";
  EXPECT_EQ(batch_->active(), 1) << "the next request took the freed cache";
  while (batch_->active() > 0) scheduler_->RunStep();
  EXPECT_EQ(AwaitSamples(waiting, 1).size(), 1u);
  absl::MutexLock lock(&cancelled.mutex);
  EXPECT_TRUE(cancelled.samples.empty());
  EXPECT_FALSE(cancelled.failure.has_value()) << "the client left; nobody to tell";
}

TEST_F(SchedulerTest, APassedDeadlineFailsTheRequest) {
  Start({.clock = &clock_});
  Outcome& outcome = NewOutcome();
  auto work = Work("late", 1, 1, 2, 50, outcome);
  work->deadline = clock_.Now() + absl::Seconds(30);
  ASSERT_TRUE(Submit(work).ok());
  scheduler_->RunStep();
  clock_.Advance(absl::Seconds(29));
  scheduler_->RunStep();
  EXPECT_EQ(batch_->active(), 1) << "within its deadline";
  clock_.Advance(absl::Seconds(2));
  scheduler_->RunStep();
  EXPECT_EQ(batch_->active(), 0);
  const std::optional<absl::Status> failure = Failure(outcome);
  ASSERT_TRUE(failure.has_value());
  EXPECT_TRUE(absl::IsDeadlineExceeded(*failure)) << *failure;
}

TEST_F(SchedulerTest, DrainEndsRunningSamplesWithTheirTokensAndWaitingOnesWithNone) {
  Start({.kv_cache_bytes = 50});
  Outcome& outcome = NewOutcome();
  ASSERT_TRUE(Submit(Work("r", 2, 1, 2, 3, outcome)).ok());
  scheduler_->RunStep();
  scheduler_->Drain();
  scheduler_->RunStep();
  const std::vector<SampleOutput> samples = AwaitSamples(outcome, 2);
  ASSERT_EQ(samples.size(), 2u);
  for (const SampleOutput& sample : samples) {
    EXPECT_EQ(sample.finish_reason, engine::FinishReason::kCancelled);
    EXPECT_EQ(sample.tokens.size(), sample.sample == 0 ? 2u : 0u) << sample.sample;
  }
}

TEST_F(SchedulerTest, RequestsWaitForTheirAdapterAndFailWhenItCannotExist) {
  Start({});
  Outcome& waiting = NewOutcome();
  Outcome& missing = NewOutcome();
  auto work = Work("w", 1, 1, 2, 2, waiting);
  work->adapter.set_adapter_name("policy");
  work->adapter.set_latest(true);
  ASSERT_TRUE(Submit(work).ok());
  auto bad = Work("m", 1, 1, 2, 2, missing);
  bad->adapter.set_adapter_name("missing");
  ASSERT_TRUE(Submit(bad).ok());
  scheduler_->RunStep();
  EXPECT_EQ(batch_->active(), 0) << "no version of 'policy' yet";
  ASSERT_TRUE(Failure(missing).has_value());
  EXPECT_TRUE(absl::IsNotFound(*Failure(missing)));
  models_.Publish("policy", 4);
  scheduler_->RunStep();
  while (batch_->active() > 0) scheduler_->RunStep();
  const std::vector<SampleOutput> samples = AwaitSamples(waiting, 1);
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(samples[0].adapter_version, 4);
}

TEST_F(SchedulerTest, SamplesAllowedToSwitchMoveToTheNewestVersionBetweenSteps) {
  Start({});
  models_.Publish("policy", 1);
  Outcome& outcome = NewOutcome();
  auto work = Work("s", 1, 1, 2, 4, outcome);
  work->adapter.set_adapter_name("policy");
  work->adapter.set_latest(true);
  work->allow_version_switch = true;
  ASSERT_TRUE(Submit(work).ok());
  scheduler_->RunStep();  // Prefill (token 1) and one decode step (token 2) on version 1.
  models_.Publish("policy", 2);
  while (batch_->active() > 0) scheduler_->RunStep();
  const std::vector<SampleOutput> samples = AwaitSamples(outcome, 1);
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(samples[0].adapter_version, 1) << "the version that prefilled it";
  EXPECT_THAT(samples[0].token_versions, ElementsAre(1, 1, 2, 2));
}

// A sample that waited for KV cache while a newer version came is prefilled on the version its
// request resolved to, and moves to the newest in the same step (the plan switches samples it
// admits, too).
TEST_F(SchedulerTest, ASampleThatWaitedForCacheMovesToTheNewestVersionWhenAdmitted) {
  Start({.kv_cache_bytes = 50});  // One sample of (2 + 3) positions at a time.
  models_.Publish("policy", 1);
  Outcome& first = NewOutcome();
  Outcome& second = NewOutcome();
  auto running = Work("a", 1, 1, 2, 3, first);
  running->adapter.set_adapter_name("policy");
  running->adapter.set_latest(true);
  auto waiting = Work("b", 1, 1, 2, 3, second);
  waiting->adapter.set_adapter_name("policy");
  waiting->adapter.set_latest(true);
  waiting->allow_version_switch = true;
  ASSERT_TRUE(Submit(running).ok());
  ASSERT_TRUE(Submit(waiting).ok());
  scheduler_->RunStep();  // "a" runs; "b" resolved to version 1 waits for cache.
  EXPECT_EQ(batch_->active(), 1);
  models_.Publish("policy", 2);
  while (AwaitSamples(first, 0).empty() || batch_->active() > 0) scheduler_->RunStep();
  const std::vector<SampleOutput> samples = AwaitSamples(second, 1);
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(samples[0].adapter_version, 1) << "the version its request resolved to";
  EXPECT_THAT(samples[0].token_versions, ElementsAre(1, 2, 2));
}

TEST_F(SchedulerTest, RecordingRoutesWithoutARouterReplayFailsTheRoutesNotTheSample) {
  Start({});
  Outcome& outcome = NewOutcome();
  auto work = Work("r", 1, 1, 2, 2, outcome);
  work->routes = {.enabled = true, .job_id = "job-1"};
  ASSERT_TRUE(Submit(work).ok());
  RunUntilIdle();
  const std::vector<SampleOutput> samples = AwaitSamples(outcome, 1);
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(samples[0].routes, RouteOutcome::kFailed);
  EXPECT_THAT(samples[0].route_error, HasSubstr("--router_replay"));
  EXPECT_EQ(samples[0].route_key->sample_id, "p0/0");
}

// Each sample's routes go to the sink under its own record key, all its rows (prompt + generated
// − 1) as the engine captured them, sealed; the sample says RECORDED once they are acknowledged.
TEST_F(SchedulerTest, EachSampleRecordsItsRoutesUnderItsKeySealedAndAcknowledged) {
  Start({}, &routes_);
  Outcome& outcome = NewOutcome();
  ASSERT_TRUE(Submit(RecordingWork("r", 2, 2, outcome)).ok());
  RunUntilIdle();
  const std::vector<SampleOutput> samples = AwaitSamples(outcome, 4);
  ASSERT_EQ(samples.size(), 4u);
  const router_replay::RouteShape shape = RouteShapeOfModel();
  const std::map<std::string, router_replay::testing::FakeRouteSink::Record> records =
      routes_.records();
  ASSERT_EQ(records.size(), 4u);
  for (const SampleOutput& sample : samples) {
    EXPECT_EQ(sample.routes, RouteOutcome::kRecorded) << sample.route_error;
    // Prompt of 2, then the generated.
    const int64_t rows = static_cast<int64_t>(sample.tokens.size()) + 2 - 1;
    EXPECT_EQ(sample.route_rows, rows);
    EXPECT_EQ(sample.route_key->job_id, "job-1");
    EXPECT_EQ(sample.route_key->sample_id,
              absl::StrCat("p", sample.sample / 2, "/", sample.sample % 2));
    const router_replay::RecordKey key{.job_id = "job-1",
                                       .policy_version = sample.adapter_version,
                                       .sample_id = sample.route_key->sample_id};
    const auto record = records.find(router_replay::EncodeRecordKey(key));
    ASSERT_NE(record, records.end()) << key.sample_id;
    EXPECT_TRUE(record->second.sealed);
    EXPECT_EQ(record->second.shape, shape);
    ASSERT_EQ(static_cast<int64_t>(record->second.rows.size()), rows * shape.ids_per_row());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < shape.ids_per_row(); ++j) {
        EXPECT_EQ(record->second.rows[r * shape.ids_per_row() + j], FakeBatch::RouteId(r, j));
      }
    }
  }
}

// Routes router-replay refused or lost fail the routes, with the reason, never the sample.
TEST_F(SchedulerTest, RoutesTheSinkRefusesOrLosesFailTheRoutesNotTheSample) {
  Start({}, &routes_);
  routes_.FailAppends(absl::ResourceExhaustedError("route buffer full for 200ms"));
  Outcome& refused = NewOutcome();
  ASSERT_TRUE(Submit(RecordingWork("refused", 1, 1, refused)).ok());
  RunUntilIdle();
  std::vector<SampleOutput> samples = AwaitSamples(refused, 1);
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(samples[0].routes, RouteOutcome::kFailed);
  EXPECT_THAT(samples[0].route_error, HasSubstr("route buffer full"));
  EXPECT_EQ(samples[0].route_rows, 0);
  EXPECT_EQ(samples[0].finish_reason, engine::FinishReason::kLength);

  routes_.FailAppends(absl::OkStatus());
  routes_.FailAcknowledgements(absl::UnavailableError("router-replay went away"));
  Outcome& lost = NewOutcome();
  ASSERT_TRUE(Submit(RecordingWork("lost", 1, 1, lost)).ok());
  RunUntilIdle();
  samples = AwaitSamples(lost, 1);
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(samples[0].routes, RouteOutcome::kFailed);
  EXPECT_THAT(samples[0].route_error, HasSubstr("router-replay went away"));
  EXPECT_EQ(samples[0].tokens.size(), 3u);
}

// A request that does not ask for its routes sends none.
TEST_F(SchedulerTest, RoutesNotRequestedAreNotRecorded) {
  Start({}, &routes_);
  Outcome& outcome = NewOutcome();
  ASSERT_TRUE(Submit(Work("plain", 1, 1, 2, 2, outcome)).ok());
  RunUntilIdle();
  const std::vector<SampleOutput> samples = AwaitSamples(outcome, 1);
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(samples[0].routes, RouteOutcome::kNotRequested);
  EXPECT_TRUE(routes_.records().empty());
}

}  // namespace
}  // namespace tandem::rollout
