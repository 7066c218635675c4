// Gloo collectives between real ranks on loopback: threads of this process sharing an
// in-process rendezvous store, and forked processes sharing a file store, for a peer that dies.
#include "common/gloo_communicator.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/testing/test_dir.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/hash_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

// Runs `body` as each of `size` ranks, one thread each, joined through one in-process store.
void RunRanks(int size, const GlooOptions& options,
              const std::function<void(GlooCommunicator&)>& body) {
  gloo::rendezvous::HashStore store;
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < size; ++rank) {
    ranks.emplace_back([&, rank] {
      absl::StatusOr<std::unique_ptr<GlooCommunicator>> communicator =
          GlooCommunicator::Create(store, rank, size, options);
      ASSERT_TRUE(communicator.ok()) << communicator.status();
      body(**communicator);
    });
  }
  for (std::thread& rank : ranks) rank.join();
}

// A value no other (rank, peer, index) gives, exactly representable in float.
float Tagged(int from, int to, int64_t index) {
  return static_cast<float>(from * 1'000'000 + to * 100'000 + index);
}

TEST(GlooCommunicatorTest, FourRanksSumBroadcastMeetAndExchangeUnevenShares) {
  constexpr int kRanks = 4;
  constexpr int64_t kCount = 300'007;  // Several of Gloo's 1 MiB segments, and a ragged end.
  RunRanks(kRanks, {}, [&](GlooCommunicator& communicator) {
    const int rank = communicator.rank();
    EXPECT_EQ(communicator.size(), kRanks);
    std::vector<float> values(kCount);
    for (int64_t i = 0; i < kCount; ++i) values[i] = static_cast<float>(rank + 1) * (i % 7);
    ASSERT_TRUE(communicator.AllReduceSum(values.data(), kCount).ok());
    for (int64_t i = 0; i < kCount; i += 9973) {
      ASSERT_EQ(values[i], 10.0f * (i % 7)) << "index " << i;  // (1 + 2 + 3 + 4) * (i % 7)
    }

    std::vector<float> broadcast(1000, static_cast<float>(rank));
    ASSERT_TRUE(communicator.Broadcast(broadcast.data(), 1000, 2).ok());
    EXPECT_THAT(broadcast, ::testing::Each(2.0f));
    ASSERT_TRUE(communicator.Barrier().ok());

    // Rank a sends (a + 1) * (b + 1) values to rank b: shares of every size, 1 to 16.
    std::vector<int64_t> send_counts(kRanks), receive_counts(kRanks);
    std::vector<float> send;
    for (int to = 0; to < kRanks; ++to) {
      send_counts[to] = (rank + 1) * (to + 1);
      receive_counts[to] = (to + 1) * (rank + 1);
      for (int64_t i = 0; i < send_counts[to]; ++i) send.push_back(Tagged(rank, to, i));
    }
    std::vector<float> received(
        std::accumulate(receive_counts.begin(), receive_counts.end(), int64_t{0}), -1.0f);
    ASSERT_TRUE(
        communicator.AllToAllV(send.data(), send_counts, received.data(), receive_counts).ok());
    std::vector<float> expected;
    for (int from = 0; from < kRanks; ++from) {
      for (int64_t i = 0; i < receive_counts[from]; ++i) expected.push_back(Tagged(from, rank, i));
    }
    EXPECT_EQ(received, expected);
  });
}

TEST(GlooCommunicatorTest, BadArgumentsAreRefusedBeforeAnythingIsSent) {
  gloo::rendezvous::HashStore store;
  EXPECT_EQ(GlooCommunicator::Create(store, 2, 2, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GlooCommunicator::Create(store, 0, 0, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      GlooCommunicator::Create(store, 0, 1, {.timeout = absl::ZeroDuration()}).status().code(),
      absl::StatusCode::kInvalidArgument);
  RunRanks(2, {}, [](GlooCommunicator& communicator) {
    float value = 1;
    EXPECT_EQ(communicator.AllReduceSum(&value, -1).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(communicator.Broadcast(&value, 1, 2).code(), absl::StatusCode::kInvalidArgument);
    const std::vector<int64_t> one_count = {1};
    const std::vector<int64_t> negative = {1, -1};
    const std::vector<int64_t> counts = {1, 1};
    float buffer[2] = {0, 0};
    EXPECT_THAT(communicator.AllToAllV(buffer, one_count, buffer, counts).message(),
                HasSubstr("send_counts has 1 counts for 2 ranks"));
    EXPECT_THAT(communicator.AllToAllV(buffer, counts, buffer, negative).message(),
                HasSubstr("receive_counts[1] is -1 < 0"));
    // The group still works: nothing was sent.
    ASSERT_TRUE(communicator.AllReduceSum(&value, 1).ok());
    EXPECT_EQ(value, 2.0f);
  });
}

TEST(GlooCommunicatorTest, OneRankIsItsOwnGroup) {
  gloo::rendezvous::HashStore store;
  absl::StatusOr<std::unique_ptr<GlooCommunicator>> communicator =
      GlooCommunicator::Create(store, 0, 1, {});
  ASSERT_TRUE(communicator.ok()) << communicator.status();
  std::vector<float> values = {1, 2, 3};
  ASSERT_TRUE((*communicator)->AllReduceSum(values.data(), 3).ok());
  ASSERT_TRUE((*communicator)->Barrier().ok());
  std::vector<float> received(3);
  const std::vector<int64_t> counts = {3};
  ASSERT_TRUE((*communicator)->AllToAllV(values.data(), counts, received.data(), counts).ok());
  EXPECT_EQ(received, values);
}

TEST(GlooCommunicatorTest, ARankThatNeverJoinsFailsTheGroupWithinTheTimeout) {
  gloo::rendezvous::HashStore store;
  const absl::Status status =
      GlooCommunicator::Create(store, 0, 2, {.timeout = absl::Milliseconds(500)}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("rank 0 of 2 cannot join"));
}

// A peer that is up but never makes the call (stuck in something else): the collective fails
// within the timeout, and the group stays failed.
TEST(GlooCommunicatorTest, AStuckPeerFailsTheCollectiveWithinTheTimeout) {
  absl::Notification failed;
  RunRanks(2, {.timeout = absl::Seconds(1)}, [&](GlooCommunicator& communicator) {
    if (communicator.rank() == 1) {
      failed.WaitForNotification();  // Stuck until rank 0 has given up.
      return;
    }
    float value = 1;
    const absl::Status status = communicator.AllReduceSum(&value, 1);
    failed.Notify();
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_THAT(status.message(), HasSubstr("AllReduceSum on rank 0 of 2"));
    EXPECT_TRUE(IsBrokenGroup(status));
    const absl::Status later = communicator.Barrier();
    EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition) << later;
    EXPECT_TRUE(IsBrokenGroup(later));
    EXPECT_FALSE(IsBrokenGroup(communicator.AllReduceSumAwaiting(nullptr, 1, absl::ZeroDuration())))
        << "a bad argument is no broken group";
    EXPECT_THAT(later.message(), HasSubstr("the group broke earlier"));
  });
}

// A phase boundary: a rank still busy with long work of its own is waited for beyond the
// group's collective timeout, up to the call's own wait, and the group stays usable.
TEST(GlooCommunicatorTest, AnAwaitingSumWaitsForASlowPeerBeyondTheCollectiveTimeout) {
  RunRanks(2, {.timeout = absl::Milliseconds(300)}, [&](GlooCommunicator& communicator) {
    if (communicator.rank() == 1) absl::SleepFor(absl::Seconds(1));
    float value = 1;
    const absl::Status status = communicator.AllReduceSumAwaiting(&value, 1, absl::Seconds(20));
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(value, 2);
    ASSERT_TRUE(communicator.AllReduceSum(&value, 1).ok());
    EXPECT_EQ(value, 4);
    EXPECT_EQ(communicator.AllReduceSumAwaiting(&value, 1, absl::ZeroDuration()).code(),
              absl::StatusCode::kInvalidArgument);
  });
}

// A peer process killed between two collectives: the next one fails on the survivor (the
// connection closes), never hangs.
TEST(GlooCommunicatorTest, APeerProcessKilledMidJobFailsTheNextCollective) {
  const std::string dir = tandem::testing::FreshTestDir("gloo");
  const GlooOptions options{.timeout = absl::Seconds(20)};
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // Rank 1: one sum, then it dies without a word.
    gloo::rendezvous::FileStore store(dir);
    auto communicator = GlooCommunicator::Create(store, 1, 2, options);
    float value = 1;
    if (!communicator.ok() || !(*communicator)->AllReduceSum(&value, 1).ok()) _exit(1);
    raise(SIGKILL);
  }
  gloo::rendezvous::FileStore store(dir);
  absl::StatusOr<std::unique_ptr<GlooCommunicator>> communicator =
      GlooCommunicator::Create(store, 0, 2, options);
  ASSERT_TRUE(communicator.ok()) << communicator.status();
  float value = 1;
  ASSERT_TRUE((*communicator)->AllReduceSum(&value, 1).ok());
  EXPECT_EQ(value, 2.0f);
  int wait_status = 0;
  ASSERT_EQ(waitpid(child, &wait_status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(wait_status) && WTERMSIG(wait_status) == SIGKILL);
  const absl::Time start = absl::Now();
  const absl::Status status = (*communicator)->AllReduceSum(&value, 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_LT(absl::Now() - start, options.timeout + absl::Seconds(5)) << "bounded, not a hang";
}

}  // namespace
}  // namespace tandem
