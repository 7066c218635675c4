#include "services/trainer/ranks/rank_roster.h"

#include <atomic>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::trainer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

internal::v1::GetAssignmentResponse AssignmentOf(const std::string& group) {
  internal::v1::GetAssignmentResponse assignment;
  assignment.set_group(group);
  assignment.mutable_job()->set_id("job-1");
  assignment.set_start_step(3);
  assignment.set_first_version(7);
  return assignment;
}

TEST(RankRosterTest, EachRankTakesItsOwnAssignmentUntilItIsWithdrawn) {
  RankRoster roster(4);
  EXPECT_EQ(roster.Take(1).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(roster.Post(AssignmentOf("job-1/a1"), 3).ok());
  absl::StatusOr<internal::v1::GetAssignmentResponse> second = roster.Take(2);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->data_parallel_rank(), 2);
  EXPECT_EQ(second->group(), "job-1/a1");
  EXPECT_EQ(second->first_version(), 7);
  EXPECT_EQ(roster.Take(3).status().code(), absl::StatusCode::kNotFound);  // Not in the job.
  roster.Withdraw("job-1/a1");
  EXPECT_EQ(roster.Take(2).status().code(), absl::StatusCode::kNotFound);
}

TEST(RankRosterTest, RanksOutsideTheDeploymentAndJobsTooLargeAreRefused) {
  RankRoster roster(2);
  for (const int rank : {0, 2, -1}) {
    EXPECT_EQ(roster.Take(rank).status().code(), absl::StatusCode::kInvalidArgument) << rank;
  }
  const absl::Status status = roster.Post(AssignmentOf("g"), 3);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("has 2"));
}

TEST(RankRosterTest, AWaitEndsWhenEveryRankTookTheAssignment) {
  RankRoster roster(3);
  ASSERT_TRUE(roster.Post(AssignmentOf("g"), 3).ok());
  std::vector<std::string> said;
  std::atomic<bool> cancelled{false};
  // Each report lets one more rank join, as ranks coming up one by one do.
  const absl::Status status = roster.AwaitJoined(
      "g", 3, absl::Now() + absl::Seconds(30), cancelled, [&](const std::string& waiting) {
        said.push_back(waiting);
        EXPECT_TRUE(roster.Take(said.size() == 1 ? 2 : 1).ok());
      });
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_THAT(said, ElementsAre("waiting for trainer ranks 1, 2 to join (1 of 3 up)",
                                "waiting for trainer ranks 1 to join (2 of 3 up)"));
}

TEST(RankRosterTest, AWaitFailsNamingTheRanksThatNeverCame) {
  RankRoster roster(4);
  ASSERT_TRUE(roster.Post(AssignmentOf("g"), 4).ok());
  ASSERT_TRUE(roster.Take(2).ok());
  std::atomic<bool> cancelled{false};
  // A deadline already passed: the wait ends at once.
  const absl::Status status =
      roster.AwaitJoined("g", 4, absl::Now(), cancelled, [](const std::string&) {});
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(status.message(), HasSubstr("trainer ranks 1, 3 of 4 did not join"));
}

TEST(RankRosterTest, AnAssignmentOfAnEarlierRunDoesNotCountAsJoined) {
  RankRoster roster(2);
  ASSERT_TRUE(roster.Post(AssignmentOf("job-1/a1"), 2).ok());
  ASSERT_TRUE(roster.Take(1).ok());
  ASSERT_TRUE(roster.Post(AssignmentOf("job-1/a2"), 2).ok());
  std::atomic<bool> cancelled{false};
  EXPECT_EQ(roster
                .AwaitJoined("job-1/a2", 2, absl::Now() + absl::Milliseconds(100), cancelled,
                             [](const std::string&) {})
                .code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(RankRosterTest, ACancelEndsTheWait) {
  RankRoster roster(2);
  ASSERT_TRUE(roster.Post(AssignmentOf("g"), 2).ok());
  std::atomic<bool> cancelled{true};
  EXPECT_EQ(roster
                .AwaitJoined("g", 2, absl::Now() + absl::Seconds(30), cancelled,
                             [](const std::string&) {})
                .code(),
            absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace tandem::trainer
