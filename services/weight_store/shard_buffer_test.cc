#include "services/weight_store/shard_buffer.h"

#include <memory>

#include "gtest/gtest.h"

namespace tandem::weight_store {
namespace {

// Plain memory (no UCX worker): the pool keeps and hands out buffers alike.
std::unique_ptr<ShardBuffer> New(ShardBufferPool& pool, size_t length) {
  return *pool.Take(length);
}

TEST(ShardBufferPoolTest, AKeptBufferIsTakenAgainForItsLengthOnly) {
  ShardBufferPool pool(nullptr, 100);
  std::unique_ptr<ShardBuffer> buffer = New(pool, 40);
  char* const memory = buffer->data();
  pool.Give(std::move(buffer));
  EXPECT_NE(New(pool, 41)->data(), memory);
  std::unique_ptr<ShardBuffer> again = New(pool, 40);
  EXPECT_EQ(again->data(), memory);
  EXPECT_NE(New(pool, 40)->data(), memory);  // Taken: the pool holds it no more.
}

TEST(ShardBufferPoolTest, BuffersGivenLongestAgoMakeRoomForNewOnes) {
  ShardBufferPool pool(nullptr, 100);
  std::unique_ptr<ShardBuffer> old_size[2] = {New(pool, 30), New(pool, 30)};
  std::unique_ptr<ShardBuffer> new_size = New(pool, 60);
  char* const kept_old = old_size[1]->data();
  char* const kept_new = new_size->data();
  pool.Give(std::move(old_size[0]));
  pool.Give(std::move(old_size[1]));
  // 60 more bytes than the pool's 40 free: the first 30-byte buffer makes way, the second stays.
  pool.Give(std::move(new_size));
  EXPECT_EQ(New(pool, 60)->data(), kept_new);
  std::unique_ptr<ShardBuffer> second = New(pool, 30);
  EXPECT_EQ(second->data(), kept_old);
  EXPECT_NE(New(pool, 30)->data(), kept_old);
}

TEST(ShardBufferPoolTest, ABufferLargerThanThePoolIsFreedAndEvictsNothing) {
  ShardBufferPool pool(nullptr, 100);
  std::unique_ptr<ShardBuffer> small = New(pool, 50);
  char* const kept = small->data();
  pool.Give(std::move(small));
  pool.Give(New(pool, 101));
  EXPECT_EQ(New(pool, 50)->data(), kept);
}

}  // namespace
}  // namespace tandem::weight_store
