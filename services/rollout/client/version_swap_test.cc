#include "services/rollout/client/version_swap.h"

#include <vector>

#include "common/testing/simulated_clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/rollout/client/testing/fake_rollout.h"

namespace tandem::rollout {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr VersionSwapOptions kOptions{.timeout = absl::Seconds(1),
                                      .poll_initial = absl::Milliseconds(1),
                                      .poll_max = absl::Milliseconds(4)};

class VersionSwapTest : public ::testing::Test {
 protected:
  VersionSwapTest() {
    for (auto& state : states_) {
      absl::MutexLock lock(&state.mutex);
      state.newest_published = 5;
    }
  }
  std::vector<ReplicaStub> Replicas() {
    return {{.address = "replica-0", .stub = &stubs_[0]},
            {.address = "replica-1", .stub = &stubs_[1]}};
  }

  testing::FakeRolloutState states_[2];
  testing::FakeRolloutStub stubs_[2] = {testing::FakeRolloutStub(states_[0]),
                                        testing::FakeRolloutStub(states_[1])};
  tandem::testing::SimulatedClock clock_;
};

TEST_F(VersionSwapTest, AWatchedReplicaTellsItsSwapWithoutBeingPolled) {
  {
    absl::MutexLock lock(&states_[1].mutex);
    states_[1].swap_after_polls = 4;  // Four "still loading" statuses first.
  }
  EXPECT_TRUE(AwaitVersionServed(Replicas(), "policy", 5, kOptions, clock_).ok());
  EXPECT_TRUE(clock_.sleeps().empty());
  for (testing::FakeRolloutState& state : states_) {
    absl::MutexLock lock(&state.mutex);
    EXPECT_EQ(state.watches, 1);
    EXPECT_EQ(state.polls, 0);
  }
}

TEST_F(VersionSwapTest, AWatchedReplicaThatNeverSwapsFailsTheWaitNamingItAndItsError) {
  {
    absl::MutexLock lock(&states_[0].mutex);
    states_[0].never_swaps = true;
  }
  const absl::Status status = AwaitVersionServed(Replicas(), "policy", 5, kOptions, clock_);
  EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("rollout replica-0 did not serve version 5 within 1s"));
  EXPECT_THAT(status.message(), HasSubstr("last error: still loading"));
}

// A replica that predates WatchAdapterStatus is asked again after 1, 2, 4, 4 ms ... until it
// serves the version.
TEST_F(VersionSwapTest, AReplicaWithoutTheWatchIsPolledWithDoublingPauses) {
  {
    absl::MutexLock lock(&states_[1].mutex);
    states_[1].watchable = false;
    states_[1].swap_after_polls = 4;
  }
  EXPECT_TRUE(AwaitVersionServed(Replicas(), "policy", 5, kOptions, clock_).ok());
  EXPECT_THAT(clock_.sleeps(), ElementsAre(absl::Milliseconds(1), absl::Milliseconds(2),
                                           absl::Milliseconds(4), absl::Milliseconds(4)));
}

TEST_F(VersionSwapTest, APolledReplicaThatNeverSwapsFailsTheWaitNamingItAndItsError) {
  {
    absl::MutexLock lock(&states_[0].mutex);
    states_[0].watchable = false;
    states_[0].never_swaps = true;
  }
  const absl::Time start = clock_.Now();
  const absl::Status status = AwaitVersionServed(Replicas(), "policy", 5, kOptions, clock_);
  EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("rollout replica-0 did not serve version 5 within 1s"));
  EXPECT_THAT(status.message(), HasSubstr("last error: still loading"));
  EXPECT_GE(clock_.Now() - start, absl::Seconds(1));
  EXPECT_LE(clock_.Now() - start, absl::Seconds(1) + absl::Milliseconds(4));
}

}  // namespace
}  // namespace tandem::rollout
