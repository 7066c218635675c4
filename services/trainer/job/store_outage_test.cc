#include "services/trainer/job/store_outage.h"

#include <atomic>
#include <vector>

#include "common/status.h"
#include "common/testing/simulated_clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::trainer {
namespace {

using ::testing::HasSubstr;

constexpr OutagePolicy kPolicy{.initial_backoff = absl::Milliseconds(500),
                               .max_backoff = absl::Seconds(2),
                               .budget = absl::Seconds(10)};

// The attempts a call sees, answering `failures` in turn, then OK.
struct ScriptedStore {
  std::vector<absl::Status> failures;
  std::vector<int> attempts;
  absl::Status operator()(int attempt) {
    attempts.push_back(attempt);
    return attempt < static_cast<int>(failures.size()) ? failures[attempt] : absl::OkStatus();
  }
};

TEST(StoreOutageTest, UnavailableAndBusyStoresAreRetriedWithDoublingBackoff) {
  testing::SimulatedClock clock;
  std::atomic<bool> cancelled = false;
  ScriptedStore store{
      .failures = {absl::UnavailableError("restarting"), absl::ResourceExhaustedError("disk full"),
                   absl::UnavailableError("restarting"), absl::UnavailableError("restarting")}};
  const absl::Time start = clock.Now();
  EXPECT_TRUE(RideOutOutage("weight-store", kPolicy, cancelled, clock, std::ref(store)).ok());
  EXPECT_THAT(store.attempts, ::testing::ElementsAre(0, 1, 2, 3, 4));
  // 0.5 + 1 + 2 + 2 (capped) seconds of waiting, in slices that look for a cancel.
  EXPECT_EQ(clock.Now() - start, absl::Milliseconds(5500));
  for (const absl::Duration slice : clock.sleeps()) EXPECT_LE(slice, absl::Milliseconds(50));
}

TEST(StoreOutageTest, AnOutageLongerThanTheBudgetFailsNamingTheStoreAndTheTime) {
  testing::SimulatedClock clock;
  std::atomic<bool> cancelled = false;
  ScriptedStore store{.failures = std::vector<absl::Status>(100, absl::UnavailableError("gone"))};
  const absl::Status status =
      RideOutOutage("router-replay", kPolicy, cancelled, clock, std::ref(store));
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("router-replay unavailable for 9s"));
  EXPECT_THAT(status.message(), HasSubstr("(outage budget 10s): gone"));
  EXPECT_EQ(store.attempts.size(), 7u);  // At 0, 0.5, 1.5, 3.5, 5.5, 7.5, 9.5 s.
}

TEST(StoreOutageTest, OtherErrorsAndSuccessReturnAtOnce) {
  testing::SimulatedClock clock;
  std::atomic<bool> cancelled = false;
  ScriptedStore store{.failures = {InvalidRequest("BAD_MANIFEST", "bad manifest")}};
  const absl::Time start = clock.Now();
  EXPECT_TRUE(absl::IsInvalidArgument(
      RideOutOutage("weight-store", kPolicy, cancelled, clock, std::ref(store))));
  EXPECT_EQ(store.attempts.size(), 1u);
  EXPECT_EQ(clock.Now(), start);
}

TEST(StoreOutageTest, ACancelEndsTheWaitAtTheNextSlice) {
  testing::SimulatedClock clock;
  std::atomic<bool> cancelled = false;
  int calls = 0;
  const absl::Status status = RideOutOutage("weight-store", kPolicy, cancelled, clock, [&](int) {
    ++calls;
    cancelled = true;  // The job is cancelled while the store is down.
    return absl::UnavailableError("restarting");
  });
  EXPECT_TRUE(absl::IsCancelled(status)) << status;
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(clock.sleeps().empty());
}

}  // namespace
}  // namespace tandem::trainer
