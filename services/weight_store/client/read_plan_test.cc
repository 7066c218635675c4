#include "services/weight_store/client/read_plan.h"

#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::weight_store {
namespace {

internal::v1::CopyOp Op(int shard, uint64_t src, uint64_t dst, uint64_t length,
                           uint64_t count = 1, uint64_t src_stride = 0, uint64_t dst_stride = 0) {
  internal::v1::CopyOp op;
  op.set_shard_index(shard);
  op.set_src_offset(src);
  op.set_dst_offset(dst);
  op.set_length(length);
  op.set_count(count);
  op.set_src_stride(src_stride);
  op.set_dst_stride(dst_stride);
  return op;
}

// Two shards of 4 KiB; tensor "t" of `tensor_bytes` filled by `op`.
internal::v1::GetReadPlanResponse PlanWith(const internal::v1::CopyOp& op,
                                              uint64_t tensor_bytes = 1024) {
  internal::v1::GetReadPlanResponse plan;
  for (int shard = 0; shard < 2; ++shard) {
    internal::v1::ShardRegion* region = plan.add_shards();
    region->set_shard_index(shard);
    region->set_length(4096);
  }
  internal::v1::PlannedTensor* tensor = plan.add_tensors();
  tensor->mutable_tensor()->mutable_spec()->set_name("t");
  tensor->mutable_tensor()->set_byte_size(tensor_bytes);
  *tensor->add_ops() = op;
  return plan;
}

TEST(ReadPlanTest, OpsInsideTheirShardAndTensorPass) {
  // 8 rows of 128 bytes, every other 128 bytes of shard 1, ending exactly at both ends.
  const internal::v1::GetReadPlanResponse plan = PlanWith(Op(1, 2048, 0, 128, 8, 256, 128));
  absl::StatusOr<RegionsByShard> regions = CheckedRegions(plan);
  ASSERT_TRUE(regions.ok()) << regions.status();
  EXPECT_EQ(regions->at(1)->shard_index(), 1);
}

TEST(ReadPlanTest, OpsThatWouldReadOrWritePastMemoryAreRefused) {
  const uint64_t huge = std::numeric_limits<uint64_t>::max() / 2;
  const struct {
    std::string what;
    internal::v1::CopyOp op;
  } cases[] = {
      {"past the shard", Op(0, 4000, 0, 128)},
      {"past the tensor", Op(0, 0, 1000, 128)},
      {"strided past the tensor", Op(0, 0, 0, 128, 8, 128, 256)},
      {"unknown shard", Op(7, 0, 0, 128)},
      {"overflowing stride", Op(0, 0, 0, 128, 3, huge, 128)},
      {"overflowing offset", Op(0, std::numeric_limits<uint64_t>::max() - 10, 0, 128)},
      {"no blocks", Op(0, 0, 0, 128, 0)},
      {"empty blocks", Op(0, 0, 0, 0)},
  };
  for (const auto& [what, op] : cases) {
    absl::StatusOr<RegionsByShard> regions = CheckedRegions(PlanWith(op));
    EXPECT_EQ(regions.status().code(), absl::StatusCode::kInternal) << what;
    EXPECT_EQ(regions.status().message(), "read plan of tensor t reads or writes out of bounds")
        << what;
  }
  internal::v1::GetReadPlanResponse twice = PlanWith(Op(0, 0, 0, 128));
  twice.add_shards()->set_shard_index(0);
  EXPECT_EQ(CheckedRegions(twice).status().message(), "read plan lists shard 0 twice");
}

TEST(ReadPlanTest, OnlyTensorsOfLargeSingleBlocksAreReadDirectly) {
  constexpr uint64_t kLarge = kMinDirectReadBytes;
  EXPECT_TRUE(ReadsDirectly(PlanWith(Op(0, 0, 0, kLarge), kLarge).tensors(0)));
  EXPECT_FALSE(ReadsDirectly(PlanWith(Op(0, 0, 0, kLarge - 1), kLarge).tensors(0)));
  // Blocks that touch on both sides are one block.
  EXPECT_TRUE(
      ReadsDirectly(PlanWith(Op(0, 0, 0, kLarge / 8, 8, kLarge / 8, kLarge / 8), kLarge).tensors(0)));
  EXPECT_FALSE(
      ReadsDirectly(PlanWith(Op(0, 0, 0, kLarge / 8, 8, kLarge / 4, kLarge / 8), kLarge).tensors(0)));
  EXPECT_FALSE(
      ReadsDirectly(PlanWith(Op(0, 0, 0, kLarge / 8, 8, kLarge / 8, kLarge / 4), kLarge).tensors(0)));
}

TEST(ReadPlanTest, SpansMergeNearbyReadsOfAShardAndKeepFarOnesApart) {
  internal::v1::GetReadPlanResponse plan = PlanWith(Op(0, 0, 0, 128, 4, 256, 128), 512);
  internal::v1::PlannedTensor* second = plan.add_tensors();
  second->mutable_tensor()->set_byte_size(512);
  *second->add_ops() = Op(0, 2048, 0, 128, 2, 256, 128);
  *second->add_ops() = Op(1, 0, 256, 128, 2, 256, 128);  // Another shard's: not in shard 0's.
  internal::v1::PlannedTensor* direct =
      plan.add_tensors();  // Read straight into its memory: no span.
  direct->mutable_tensor()->set_byte_size(kMinDirectReadBytes);
  *direct->add_ops() = Op(0, uint64_t{32} << 20, 0, kMinDirectReadBytes);
  internal::v1::PlannedTensor* far = plan.add_tensors();
  far->mutable_tensor()->set_byte_size(512);
  *far->add_ops() = Op(0, uint64_t{64} << 20, 0, 256, 2, 512, 256);
  // 64 KiB past the first span's end: far enough to be read on its own.
  internal::v1::PlannedTensor* apart = plan.add_tensors();
  apart->mutable_tensor()->set_byte_size(256);
  *apart->add_ops() = Op(0, 2432 + (64 << 10) + 1, 0, 128, 2, 256, 128);
  const std::vector<StagedSpan> spans = SpansOf(plan, 0, 5, /*shard=*/0);
  ASSERT_EQ(spans.size(), 3);
  EXPECT_EQ(spans[0].begin, 0);
  EXPECT_EQ(spans[0].end, 2432);
  EXPECT_EQ(spans[1].begin, 2432 + (64 << 10) + 1);
  EXPECT_EQ(spans[2].begin, uint64_t{64} << 20);
  EXPECT_EQ(spans[2].end, (uint64_t{64} << 20) + 768);
  EXPECT_EQ(SpansOf(plan, 2, 4, /*shard=*/1).size(), 0);
}

TEST(ReadPlanTest, BatchesHoldAboutTheBatchSize) {
  internal::v1::GetReadPlanResponse plan;
  const auto add = [&plan](uint64_t bytes, bool direct) {
    internal::v1::PlannedTensor* tensor = plan.add_tensors();
    tensor->mutable_tensor()->set_byte_size(bytes);
    *tensor->add_ops() = direct ? Op(0, 0, 0, bytes) : Op(0, 0, 0, bytes / 2, 2, bytes, bytes / 2);
  };
  const uint64_t quarter = kBatchBytes / 4;
  // Direct and staged tensors mix within a batch: one get reads both.
  for (int i = 0; i < 9; ++i) add(quarter, /*direct=*/i % 2 == 0);
  const std::vector<TensorBatch> batches = BatchesOf(plan);
  ASSERT_EQ(batches.size(), 3);
  EXPECT_EQ(batches[0].first, 0);
  EXPECT_EQ(batches[0].last, 4);
  EXPECT_EQ(batches[1].first, 4);
  EXPECT_EQ(batches[1].last, 8);
  EXPECT_EQ(batches[2].first, 8);
  EXPECT_EQ(batches[2].last, 9);
  EXPECT_TRUE(BatchesOf(internal::v1::GetReadPlanResponse()).empty());
}

// Shard 0 (4 KiB) read whole by two tensors: "a" takes its even 512-byte blocks, "b" its odd.
internal::v1::GetReadPlanResponse InterleavedPlan() {
  internal::v1::GetReadPlanResponse plan;
  internal::v1::ShardRegion* region = plan.add_shards();
  region->set_shard_index(0);
  region->set_length(4096);
  for (const char* name : {"a", "b"}) {
    internal::v1::PlannedTensor* tensor = plan.add_tensors();
    tensor->mutable_tensor()->mutable_spec()->set_name(name);
    tensor->mutable_tensor()->set_byte_size(2048);
    *tensor->add_ops() = Op(0, name[0] == 'a' ? 0 : 512, 0, 512, 4, 1024, 512);
  }
  return plan;
}

TEST(ReadPlanTest, AnOpsBytesComeInShardOrderOneSpanWhereTheyFollowEachOther) {
  const auto spans = [](const internal::v1::CopyOp& op) {
    std::vector<std::pair<uint64_t, uint64_t>> result;
    ForEachSourceSpan(
        op, [&](uint64_t src_offset, uint64_t length) { result.emplace_back(src_offset, length); });
    return result;
  };
  using Spans = std::vector<std::pair<uint64_t, uint64_t>>;
  EXPECT_EQ(spans(Op(0, 512, 0, 512, 3, 1024, 512)), (Spans{{512, 512}, {1536, 512}, {2560, 512}}));
  // Blocks that follow each other in the shard are one span, wherever they land.
  EXPECT_EQ(spans(Op(0, 4096, 0, 512, 4, 512, 1024)), (Spans{{4096, 2048}}));
  EXPECT_EQ(spans(Op(0, 64, 0, 100)), (Spans{{64, 100}}));
}

TEST(ReadPlanTest, ShardsReadWholeEachByteOnce) {
  const auto whole = [](const internal::v1::GetReadPlanResponse& plan, uint64_t shard_bytes) {
    return ReadsShardsWhole(plan.tensors(), [&](int) { return shard_bytes; });
  };
  const internal::v1::GetReadPlanResponse plan = InterleavedPlan();
  EXPECT_TRUE(whole(plan, 4096));
  EXPECT_FALSE(whole(plan, 8192));  // Its last 4 KiB are never read.
  internal::v1::GetReadPlanResponse twice = plan;
  twice.mutable_tensors(1)->mutable_ops(0)->set_src_offset(0);
  EXPECT_FALSE(whole(twice, 4096));
  internal::v1::GetReadPlanResponse gap = plan;
  gap.mutable_tensors(1)->mutable_ops(0)->set_count(3);
  EXPECT_FALSE(whole(gap, 4096));
}

TEST(ReadPlanTest, TilingNeedsEveryByteOfTheTensorWrittenOnce) {
  const internal::v1::GetReadPlanResponse plan = InterleavedPlan();
  EXPECT_TRUE(TilesTensor(plan.tensors(0)));
  internal::v1::PlannedTensor overlapping = plan.tensors(0);
  overlapping.mutable_ops(0)->set_dst_stride(256);
  EXPECT_FALSE(TilesTensor(overlapping));
  internal::v1::PlannedTensor short_of_its_size = plan.tensors(0);
  short_of_its_size.mutable_tensor()->set_byte_size(4096);
  EXPECT_FALSE(TilesTensor(short_of_its_size));
  // Two ops in either order tile it alike.
  internal::v1::PlannedTensor halves = plan.tensors(0);
  halves.clear_ops();
  *halves.add_ops() = Op(0, 1024, 1024, 1024);
  *halves.add_ops() = Op(0, 0, 0, 1024);
  EXPECT_TRUE(TilesTensor(halves));
}

// A tensor split by columns across two shards: each op writes every other 512-byte block.
internal::v1::PlannedTensor Columns(uint64_t left_stride, uint64_t right_offset) {
  internal::v1::PlannedTensor tensor;
  tensor.mutable_tensor()->set_byte_size(4096);
  *tensor.add_ops() = Op(0, 0, 0, 512, 4, 512, left_stride);
  *tensor.add_ops() = Op(1, 0, right_offset, 512, 4, 512, 1024);
  return tensor;
}

TEST(ReadPlanTest, InterleavedOpsTileATensorOnlyWhereTheirBlocksMeetExactly) {
  EXPECT_TRUE(TilesTensor(Columns(1024, 512)));
  EXPECT_FALSE(TilesTensor(Columns(1024, 256)));   // Overlapping the left column's blocks.
  EXPECT_FALSE(TilesTensor(Columns(1024, 1024)));  // Both write bytes [1024, 1536).
  // A contiguous left op of 2 KiB, into which the right op's first block falls.
  EXPECT_FALSE(TilesTensor(Columns(512, 512)));
  // Ops that write nothing do not count; counts and lengths that overflow never tile.
  internal::v1::PlannedTensor with_empty_op = Columns(1024, 512);
  *with_empty_op.add_ops() = Op(0, 0, 9999, 512, 0);
  EXPECT_TRUE(TilesTensor(with_empty_op));
  internal::v1::PlannedTensor overflowing;
  overflowing.mutable_tensor()->set_byte_size(0);
  *overflowing.add_ops() = Op(0, 0, 0, uint64_t{1} << 63, 2, 0, uint64_t{1} << 63);
  EXPECT_FALSE(TilesTensor(overflowing));
}

}  // namespace
}  // namespace tandem::weight_store
