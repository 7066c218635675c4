#include "services/weight_store/client/shard_order.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::weight_store {
namespace {

// Offers `shard`'s blocks [offset, offset + length) in the order given; returns what was passed
// on, in the order it was.
std::string Reordered(const std::string& shard,
                      const std::vector<std::pair<uint64_t, uint64_t>>& blocks,
                      InShardOrder& order) {
  std::string passed;
  for (const auto& [offset, length] : blocks) {
    order.Offer(offset, shard.data() + offset, length,
                [&passed](const char* bytes, uint64_t n) { passed.append(bytes, n); });
  }
  return passed;
}

TEST(InShardOrderTest, PassesBlocksOnInShardOrderHoldingThoseThatCameEarly) {
  const std::string shard = "abcdefghijklmnop";
  InShardOrder order;
  // Two interleaved runs, as a plan's tensors that each take every other block of a shard.
  EXPECT_EQ(Reordered(shard, {{0, 2}, {4, 2}, {8, 2}, {12, 4}, {2, 2}, {6, 2}, {10, 2}}, order),
            shard);
  EXPECT_TRUE(order.Complete(shard.size()));
}

TEST(InShardOrderTest, AGapLeavesTheRestHeldAndTheShardIncomplete) {
  const std::string shard = "abcdefghijklmnop";
  InShardOrder order;
  EXPECT_EQ(Reordered(shard, {{0, 4}, {8, 8}}, order), "abcd");
  EXPECT_FALSE(order.Complete(shard.size()));
  EXPECT_FALSE(order.Complete(4));  // A block is still held.
  InShardOrder short_read;
  Reordered(shard, {{0, 8}}, short_read);
  EXPECT_FALSE(short_read.Complete(shard.size()));
  EXPECT_TRUE(short_read.Complete(8));
}

TEST(InShardOrderTest, BytesOfferedTwiceAreRefused) {
  const std::string shard = "abcdefghijklmnop";
  const auto offered_twice = [&](const std::vector<std::pair<uint64_t, uint64_t>>& blocks) {
    InShardOrder order;
    bool accepted = true;
    for (const auto& [offset, length] : blocks) {
      accepted = order.Offer(offset, shard.data() + offset, length, [](const char*, uint64_t) {});
    }
    return !accepted && !order.Complete(shard.size());
  };
  EXPECT_TRUE(offered_twice({{0, 8}, {4, 12}}));          // Behind what was passed on.
  EXPECT_TRUE(offered_twice({{8, 8}, {8, 8}}));           // Two held blocks at one offset.
  EXPECT_TRUE(offered_twice({{8, 8}, {4, 4}, {0, 6}}));   // Overlapping once released.
  EXPECT_FALSE(offered_twice({{8, 8}, {4, 4}, {0, 4}}));  // The same blocks, each byte once.
}

}  // namespace
}  // namespace tandem::weight_store
