// The communicator-id bootstrap between trainer ranks: the core's rules, and the real service on
// loopback with the client other ranks use.
#include <thread>

#include "absl/strings/match.h"
#include "common/testing/test_server.h"
#include "gtest/gtest.h"
#include "services/trainer/client/communicator_id.h"
#include "services/trainer/communicator_ids.h"
#include "services/trainer/trainer_ranks_service.h"

namespace tandem::trainer {
namespace {

const std::string kId(128, '\x7f');

TEST(CommunicatorIdsTest, PublishedGroupsAnswerTheirRanks) {
  CommunicatorIds ids;
  EXPECT_EQ(ids.Get("job-1", 1, 2).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(ids.Publish("job-1", 4, kId).ok());
  ASSERT_TRUE(ids.Publish("job-1", 4, kId).ok()) << "publishing the same again is fine";
  EXPECT_EQ(*ids.Get("job-1", 3, 4), kId);
  EXPECT_EQ(ids.Publish("job-1", 4, "other").code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(ids.Get("job-1", 1, 2).status().code(), absl::StatusCode::kFailedPrecondition);
  for (const int rank : {0, 4, -1}) {
    EXPECT_EQ(ids.Get("job-1", rank, 4).status().code(), absl::StatusCode::kInvalidArgument)
        << rank;
  }
  EXPECT_EQ(ids.Get("", 1, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ids.Publish(std::string(129, 'g'), 2, kId).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ids.Publish("job-2", 1, kId).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ids.Publish("job-2", 2, "").code(), absl::StatusCode::kInvalidArgument);
  ids.Withdraw("job-1");
  EXPECT_EQ(ids.Get("job-1", 3, 4).status().code(), absl::StatusCode::kNotFound);
}

class TrainerRanksServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = testing::StartLoopbackServer(
        "trainer",
        {"tandem.v1.TrainerRanksService", std::make_unique<TrainerRanksServiceImpl>(ids_)});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = v1::TrainerRanksService::NewStub(server_.Channel());
  }

  CommunicatorIds ids_;
  testing::LoopbackServer server_;
  std::unique_ptr<v1::TrainerRanksService::Stub> stub_;
};

// A rank that asks before rank 0 has published waits for it.
TEST_F(TrainerRanksServiceTest, ARankAskingEarlyGetsTheIdOnceRankZeroPublishes) {
  std::thread rank_zero([this] {
    absl::SleepFor(absl::Milliseconds(100));
    ASSERT_TRUE(ids_.Publish("job-7", 2, kId).ok());
  });
  absl::StatusOr<std::string> id = FetchCommunicatorId(*stub_, "job-7", 1, 2, absl::Seconds(10));
  rank_zero.join();
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, kId);
}

TEST_F(TrainerRanksServiceTest, ErrorsReachTheAskerWithTheirCodes) {
  ASSERT_TRUE(ids_.Publish("job-8", 3, kId).ok());
  EXPECT_EQ(FetchCommunicatorId(*stub_, "job-8", 1, 2, absl::Seconds(5)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(FetchCommunicatorId(*stub_, "job-8", 0, 3, absl::Seconds(5)).status().code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status never =
      FetchCommunicatorId(*stub_, "job-9", 1, 2, absl::Milliseconds(200)).status();
  EXPECT_EQ(never.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(never.message(), "not published")) << never;
}

}  // namespace
}  // namespace tandem::trainer
