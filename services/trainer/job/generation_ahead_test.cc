// GenerationAhead on a recording generator: which steps generate by which version, when, and
// that holds and abandoned generations end as promised.
#include "services/trainer/job/generation_ahead.h"

#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace tandem::trainer {
namespace {

using Call = std::pair<int64_t, int64_t>;  // (step, version)

class Recorder {
 public:
  GenerationAhead::Generate Generator() {
    return [this](int64_t step, int64_t version) -> absl::StatusOr<StepSamples> {
      absl::MutexLock lock(&mutex_);
      calls_.emplace_back(step, version);
      StepSamples samples;
      samples.reward = static_cast<double>(step * 100 + version);
      return samples;
    };
  }
  std::vector<Call> calls() {
    absl::MutexLock lock(&mutex_);
    std::vector<Call> sorted = calls_;
    std::sort(sorted.begin(), sorted.end());
    return sorted;
  }

 private:
  absl::Mutex mutex_;
  std::vector<Call> calls_ ABSL_GUARDED_BY(mutex_);
};

GenerationAhead::Hold NoHold() {
  return [](int64_t) { return std::shared_ptr<void>(); };
}

TEST(GenerationAheadTest, SyncGeneratesEachStepWhenTaken) {
  Recorder recorder;
  GenerationAhead ahead(
      recorder.Generator(), NoHold(), [] {}, /*lookahead=*/0, /*last_step=*/3);
  for (int64_t step = 1; step <= 3; ++step) {
    GenerationAhead::Taken taken = ahead.Take(step, step + 10);
    ASSERT_TRUE(taken.samples.ok());
    EXPECT_EQ(taken.version, step + 10);
    ahead.StartAfter(step, step + 10);
  }
  EXPECT_EQ(recorder.calls(), (std::vector<Call>{{1, 11}, {2, 12}, {3, 13}}));
}

TEST(GenerationAheadTest, AsyncGeneratesLaterStepsByTheVersionOfTheirStart) {
  Recorder recorder;
  GenerationAhead ahead(
      recorder.Generator(), NoHold(), [] {}, /*lookahead=*/2, /*last_step=*/4);
  GenerationAhead::Taken first = ahead.Take(1, 1);
  EXPECT_EQ(first.version, 1);
  ahead.StartAfter(1, 1);  // Steps 2 and 3 by version 1.
  GenerationAhead::Taken second = ahead.Take(2, 2);
  ASSERT_TRUE(second.samples.ok());
  EXPECT_EQ(second.version, 1);
  EXPECT_EQ(second.samples->reward, 201);
  ahead.StartAfter(2, 2);  // Step 4 by version 2; 3 runs already.
  EXPECT_EQ(ahead.Take(3, 3).version, 1);
  ahead.StartAfter(3, 3);  // Nothing past the last step.
  EXPECT_EQ(ahead.Take(4, 4).version, 2);
  EXPECT_EQ(recorder.calls(), (std::vector<Call>{{1, 1}, {2, 1}, {3, 1}, {4, 2}}));
}

TEST(GenerationAheadTest, AVersionIsHeldUntilItsStepTakesTheSamples) {
  Recorder recorder;
  std::vector<int64_t> released;
  absl::Mutex mutex;
  const GenerationAhead::Hold hold = [&](int64_t version) {
    return std::shared_ptr<void>(nullptr, [&, version](void*) {
      absl::MutexLock lock(&mutex);
      released.push_back(version);
    });
  };
  GenerationAhead ahead(
      recorder.Generator(), hold, [] {}, /*lookahead=*/1, /*last_step=*/3);
  ahead.Take(1, 7);
  ahead.StartAfter(1, 7);
  ahead.Take(2, 8);
  absl::MutexLock lock(&mutex);
  EXPECT_EQ(released, std::vector<int64_t>{7});
}

TEST(GenerationAheadTest, LeavingEarlyAbandonsTheGenerationsInFlight) {
  absl::Notification abandoned;
  bool finished = false;
  {
    GenerationAhead ahead(
        [&](int64_t, int64_t) -> absl::StatusOr<StepSamples> {
          abandoned.WaitForNotification();  // A Generate call cancelled only by Abandon.
          finished = true;
          return absl::CancelledError("abandoned");
        },
        NoHold(), [&] { abandoned.Notify(); }, /*lookahead=*/1, /*last_step=*/5);
    ahead.StartAfter(1, 1);
  }
  EXPECT_TRUE(abandoned.HasBeenNotified());
  EXPECT_TRUE(finished);  // The destructor waited it out.
}

}  // namespace
}  // namespace tandem::trainer
