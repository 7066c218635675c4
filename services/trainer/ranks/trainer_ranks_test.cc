// The communicator bootstrap between trainer ranks: the cores' rules, and the real service on
// loopback with the clients other ranks use -- NCCL ids, and Gloo groups formed through the
// rendezvous values.
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "common/gloo_communicator.h"
#include "common/testing/test_server.h"
#include "gtest/gtest.h"
#include "services/trainer/client/communicator_id.h"
#include "services/trainer/client/rendezvous_store.h"
#include "services/trainer/ranks/communicator_ids.h"
#include "services/trainer/ranks/local_rendezvous_store.h"
#include "services/trainer/ranks/rank_roster.h"
#include "services/trainer/ranks/rendezvous_values.h"
#include "services/trainer/ranks/trainer_ranks_service.h"

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
        "trainer", {"tandem.internal.v1.TrainerRanksService",
                    std::make_unique<TrainerRanksServiceImpl>(ids_, rendezvous_, roster_)});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = internal::v1::TrainerRanksService::NewStub(server_.Channel());
  }

  CommunicatorIds ids_;
  RendezvousValues rendezvous_;
  RankRoster roster_{3};
  testing::LoopbackServer server_;
  std::unique_ptr<internal::v1::TrainerRanksService::Stub> stub_;
};

// A rank that asks before rank 0 has published waits for it.
TEST(RendezvousValuesTest, KeysAreSetReplacedReadAndWithdrawnWithinTheirSizes) {
  RendezvousValues values;
  EXPECT_EQ(values.Get("job-1", "rank_0").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(values.Set("job-1", "rank_0", "address-a").ok());
  ASSERT_TRUE(values.Set("job-1", "rank_0", "address-b").ok()) << "a restarted rank replaces it";
  EXPECT_EQ(*values.Get("job-1", "rank_0"), "address-b");
  EXPECT_EQ(values.Get("job-2", "rank_0").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(values.Set("", "k", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(values.Set(std::string(129, 'g'), "k", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(values.Set("job-1", std::string(257, 'k'), "v").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(values.Set("job-1", "k", std::string((1 << 20) + 1, 'v')).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(values.Get("job-1", "").status().code(), absl::StatusCode::kInvalidArgument);
  values.Withdraw("job-1");
  EXPECT_EQ(values.Get("job-1", "rank_0").status().code(), absl::StatusCode::kNotFound);
}

// CPU ranks form a Gloo group through rank 0's trainer: each sets its address and reads the
// others' over TrainerRanksService, then the group sums over TCP on loopback.
TEST_F(TrainerRanksServiceTest, CpuRanksFormAGlooGroupThroughRankZerosTrainer) {
  constexpr int kRanks = 3;
  std::vector<std::thread> ranks;
  std::vector<float> sums(kRanks);
  for (int rank = 0; rank < kRanks; ++rank) {
    ranks.emplace_back([&, rank] {
      RendezvousStore store(*stub_, "job-gloo", absl::Seconds(20));
      absl::StatusOr<std::unique_ptr<GlooCommunicator>> communicator =
          GlooCommunicator::Create(store, rank, kRanks, {.timeout = absl::Seconds(20)});
      ASSERT_TRUE(communicator.ok()) << communicator.status();
      sums[rank] = static_cast<float>(rank + 1);
      ASSERT_TRUE((*communicator)->AllReduceSum(&sums[rank], 1).ok());
    });
  }
  for (std::thread& rank : ranks) rank.join();
  EXPECT_EQ(sums, std::vector<float>(kRanks, 6.0f));
}

TEST_F(TrainerRanksServiceTest, AGroupMissingARankFailsToFormNamingTheKey) {
  RendezvousStore store(*stub_, "job-alone", absl::Milliseconds(300));
  const absl::Status status =
      GlooCommunicator::Create(store, 0, 2, {.timeout = absl::Milliseconds(300)}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "rendezvous of group job-alone")) << status;
  RendezvousStore bad(*stub_, "", absl::Seconds(5));
  EXPECT_EQ(GlooCommunicator::Create(bad, 0, 2, {}).status().code(),
            absl::StatusCode::kUnavailable);
}

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

// As in a job: rank 0 posts the job and joins through its own values in-process; the other
// ranks take the assignment and join over gRPC.
TEST_F(TrainerRanksServiceTest, RanksTakeTheirAssignmentAndJoinRankZerosGroup) {
  internal::v1::GetAssignmentRequest early;
  early.set_rank(1);
  internal::v1::GetAssignmentResponse none;
  grpc::ClientContext early_context;
  EXPECT_EQ(stub_->GetAssignment(&early_context, early, &none).error_code(),
            grpc::StatusCode::NOT_FOUND);
  internal::v1::GetAssignmentResponse posted;
  posted.set_group("job-9/a1");
  posted.mutable_job()->set_id("job-9");
  ASSERT_TRUE(roster_.Post(posted, 3).ok());
  constexpr int kRanks = 3;
  std::vector<float> sums(kRanks);
  std::vector<std::thread> ranks;
  ranks.emplace_back([&] {
    LocalRendezvousStore store(rendezvous_, "job-9/a1", absl::Seconds(20));
    auto communicator = GlooCommunicator::Create(store, 0, kRanks, {.timeout = absl::Seconds(20)});
    ASSERT_TRUE(communicator.ok()) << communicator.status();
    sums[0] = 1;
    ASSERT_TRUE((*communicator)->AllReduceSum(&sums[0], 1).ok());
  });
  for (int rank = 1; rank < kRanks; ++rank) {
    ranks.emplace_back([&, rank] {
      internal::v1::GetAssignmentRequest request;
      request.set_rank(rank);
      internal::v1::GetAssignmentResponse assignment;
      grpc::ClientContext context;
      ASSERT_TRUE(stub_->GetAssignment(&context, request, &assignment).ok());
      ASSERT_EQ(assignment.data_parallel_rank(), rank);
      ASSERT_EQ(assignment.job().id(), "job-9");
      RendezvousStore store(*stub_, assignment.group(), absl::Seconds(20));
      auto communicator = GlooCommunicator::Create(store, assignment.data_parallel_rank(), kRanks,
                                                   {.timeout = absl::Seconds(20)});
      ASSERT_TRUE(communicator.ok()) << communicator.status();
      sums[rank] = static_cast<float>(rank + 1);
      ASSERT_TRUE((*communicator)->AllReduceSum(&sums[rank], 1).ok());
    });
  }
  for (std::thread& rank : ranks) rank.join();
  EXPECT_EQ(sums, std::vector<float>(kRanks, 6.0f));
  std::atomic<bool> cancelled{false};
  EXPECT_TRUE(
      roster_.AwaitJoined("job-9/a1", kRanks, absl::Now(), cancelled, [](const std::string&) {})
          .ok());
  internal::v1::GetAssignmentRequest outside;
  outside.set_rank(3);
  grpc::ClientContext outside_context;
  EXPECT_EQ(stub_->GetAssignment(&outside_context, outside, &none).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace tandem::trainer
