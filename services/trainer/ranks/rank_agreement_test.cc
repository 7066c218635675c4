#include "services/trainer/ranks/rank_agreement.h"

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/gloo_communicator.h"
#include "gloo/rendezvous/hash_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::trainer {
namespace {

using ::testing::HasSubstr;

// Runs `body` on `ranks` Gloo ranks (a thread each) and returns each rank's status.
std::vector<absl::Status> OnRanks(int ranks,
                                  const std::function<absl::Status(Communicator&)>& body) {
  gloo::rendezvous::HashStore store;
  std::vector<absl::Status> results(ranks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      auto communicator = GlooCommunicator::Create(store, rank, ranks, {});
      results[rank] = communicator.ok() ? body(**communicator) : communicator.status();
    });
  }
  for (std::thread& thread : threads) thread.join();
  return results;
}

TEST(RankAgreementTest, EveryRankLearnsWhichRanksFailed) {
  const std::vector<absl::Status> results = OnRanks(4, [](Communicator& ranks) {
    const absl::Status local = ranks.rank() == 1 || ranks.rank() == 3
                                   ? absl::UnavailableError("rollout down")
                                   : absl::OkStatus();
    return AgreeOnFailures(ranks, local, "step 2's generation", absl::Seconds(30));
  });
  EXPECT_EQ(results[1].code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(results[3].code(), absl::StatusCode::kUnavailable);
  for (const int rank : {0, 2}) {
    EXPECT_EQ(results[rank].code(), absl::StatusCode::kAborted);
    EXPECT_THAT(results[rank].message(),
                HasSubstr("trainer ranks 1, 3 failed step 2's generation"));
  }
  for (const absl::Status& status : OnRanks(3, [](Communicator& ranks) {
         return AgreeOnFailures(ranks, absl::OkStatus(), "anything", absl::Seconds(30));
       })) {
    EXPECT_TRUE(status.ok()) << status;
  }
}

engine::ParameterSet Parameters(float value) {
  engine::ParameterSet parameters;
  parameters.Add("a", {3}).value = {1, 2, value};
  parameters.Add("b", {2}).value = {4, 5};
  return parameters;
}

TEST(RankAgreementTest, ParametersThatDifferInOneBitAreDataLossNamingTheRank) {
  const std::vector<absl::Status> results = OnRanks(3, [](Communicator& ranks) {
    const float last = ranks.rank() == 2 ? std::nextafter(3.0f, 4.0f) : 3.0f;
    return CheckIdenticalParameters(ranks, Parameters(last), 5);
  });
  for (const absl::Status& status : results) {
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(status.message(),
                HasSubstr("after step 5 the parameters of trainer rank 2 differ"));
  }
  for (const absl::Status& status : OnRanks(3, [](Communicator& ranks) {
         return CheckIdenticalParameters(ranks, Parameters(3), 1);
       })) {
    EXPECT_TRUE(status.ok()) << status;
  }
}

TEST(RankAgreementTest, RankZerosTensorsAndOptimizerStateReachEveryRank) {
  const std::vector<absl::Status> results = OnRanks(3, [](Communicator& ranks) -> absl::Status {
    const float mine = static_cast<float>(ranks.rank() + 1);
    std::map<std::string, std::vector<float>> tensors = {{"x", {mine, mine}}, {"y", {-mine}}};
    if (absl::Status status = BroadcastTensors(ranks, tensors); !status.ok()) return status;
    if (tensors != std::map<std::string, std::vector<float>>{{"x", {1, 1}}, {"y", {-1}}}) {
      return absl::InternalError(absl::StrCat("rank ", ranks.rank(), " got other tensors"));
    }
    engine::ParameterSet parameters = Parameters(mine);
    parameters.EnableGradients();
    auto optimizer = engine::AdamW::Create({}, engine::OptimizerParams(parameters));
    if (!optimizer.ok()) return optimizer.status();
    // Rank 0 has taken two steps; the others none.
    for (int step = 0; ranks.rank() == 0 && step < 2; ++step) {
      for (const std::string& name : parameters.names()) {
        std::fill(parameters.Find(name)->grad.begin(), parameters.Find(name)->grad.end(), 0.5f);
      }
      if (absl::Status status = optimizer->Step(1e-3f); !status.ok()) return status;
    }
    if (absl::Status status = BroadcastOptimizerState(ranks, *optimizer); !status.ok()) {
      return status;
    }
    if (optimizer->ExportState().step != 2) {
      return absl::InternalError(
          absl::StrCat("rank ", ranks.rank(), " is at update ", optimizer->ExportState().step));
    }
    return absl::OkStatus();
  });
  for (const absl::Status& status : results) EXPECT_TRUE(status.ok()) << status;
}

}  // namespace
}  // namespace tandem::trainer
