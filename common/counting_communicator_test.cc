#include "common/counting_communicator.h"

#include <memory>
#include <thread>
#include <vector>

#include "common/gloo_communicator.h"
#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(CountingCommunicatorTest, CountsTheBytesEachRankHandsToCollectivesAndTheirTime) {
  gloo::rendezvous::HashStore store;
  std::vector<CountingCommunicator::Counts> counts(2);
  std::vector<std::vector<float>> sums(2);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      auto gloo = GlooCommunicator::Create(store, rank, 2, {});
      ASSERT_TRUE(gloo.ok()) << gloo.status();
      CountingCommunicator counting(*std::move(gloo));
      EXPECT_EQ(counting.rank(), rank);
      EXPECT_EQ(counting.size(), 2);
      std::vector<float> values(100, static_cast<float>(rank + 1));
      ASSERT_TRUE(counting.AllReduceSum(values.data(), 100).ok());
      // Rank 1 waits in the broadcast for rank 0, which arrives late: waiting counts as time.
      if (rank == 0) absl::SleepFor(absl::Milliseconds(50));
      float root = static_cast<float>(rank);
      ASSERT_TRUE(counting.Broadcast(&root, 1, 0).ok());
      ASSERT_TRUE(counting.Barrier().ok());
      const std::vector<int64_t> each = {3, 3};
      std::vector<float> send(6, 1), receive(6);
      ASSERT_TRUE(counting.AllToAllV(send.data(), each, receive.data(), each).ok());
      sums[rank] = values;
      counts[rank] = counting.TakeCounts();
      EXPECT_EQ(counting.TakeCounts().bytes, 0) << "taking resets";
    });
  }
  for (std::thread& rank : ranks) rank.join();
  EXPECT_EQ(sums[0], std::vector<float>(100, 3.0f));
  for (const CountingCommunicator::Counts& rank : counts) {
    EXPECT_EQ(rank.bytes, (100 + 1 + 6) * 4);
  }
  EXPECT_GE(counts[1].time, absl::Milliseconds(40));
}

}  // namespace
}  // namespace tandem
