#include "services/weight_store/client/shard_verifier.h"

#include <string>
#include <thread>

#include "common/checksum.h"
#include "gtest/gtest.h"

namespace tandem::weight_store {
namespace {

// Shard 3 (64 KiB) read whole by two tensors: "a" takes its even blocks of `block` bytes, "b"
// its odd ones.
internal::v1::GetReadPlanResponse InterleavedPlan(const std::string& shard, uint64_t block = 1024) {
  internal::v1::GetReadPlanResponse plan;
  plan.set_verify_shards(true);
  internal::v1::ShardRegion* region = plan.add_shards();
  region->set_shard_index(3);
  region->set_length(shard.size());
  region->set_xxh3_64(Xxh3Checksum(shard));
  for (uint64_t first : {uint64_t{0}, block}) {
    internal::v1::PlannedTensor* tensor = plan.add_tensors();
    tensor->mutable_tensor()->set_byte_size(shard.size() / 2);
    internal::v1::CopyOp* op = tensor->add_ops();
    op->set_shard_index(3);
    op->set_src_offset(first);
    op->set_length(block);
    op->set_count(shard.size() / (2 * block));
    op->set_src_stride(2 * block);
    op->set_dst_stride(block);
  }
  return plan;
}

// Tensor `index` of InterleavedPlan as it lands from `shard`.
std::string Landed(const std::string& shard, int index, uint64_t block = 1024) {
  std::string tensor;
  for (size_t at = index * block; at < shard.size(); at += 2 * block) {
    tensor += shard.substr(at, block);
  }
  return tensor;
}

std::string ShardBytes() {
  std::string shard(64 << 10, '\0');
  for (size_t i = 0; i < shard.size(); ++i) shard[i] = static_cast<char>(i * 7 + i / 251);
  return shard;
}

TEST(ShardVerifierTest, TensorsLandingOnTwoThreadsInEitherOrderVerifyTheShard) {
  const std::string shard = ShardBytes();
  const internal::v1::GetReadPlanResponse plan = InterleavedPlan(shard);
  const std::string a = Landed(shard, 0);
  const std::string b = Landed(shard, 1);
  for (int round = 0; round < 20; ++round) {
    ShardVerifier verifier(plan);
    std::thread other([&] { verifier.OfferTensor(1, b.data()); });
    verifier.OfferTensor(0, a.data());
    other.join();
    EXPECT_TRUE(verifier.Finish().ok());
  }
}

// Blocks copied with memcpy (under 256 bytes) and with streaming stores.
TEST(ShardVerifierTest, ACopiedShardLandsInItsTensorsAndVerifies) {
  const std::string shard = ShardBytes();
  for (uint64_t block : {128, 1024, 16 << 10}) {
    const internal::v1::GetReadPlanResponse plan = InterleavedPlan(shard, block);
    std::string tensors[2] = {std::string(shard.size() / 2, '\0'),
                              std::string(shard.size() / 2, '\0')};
    ShardVerifier verifier(plan);
    verifier.CopyShard(3, shard.data(), [&tensors](int tensor) { return tensors[tensor].data(); });
    EXPECT_TRUE(verifier.Finish().ok());
    EXPECT_EQ(tensors[0], Landed(shard, 0, block));
    EXPECT_EQ(tensors[1], Landed(shard, 1, block));
    std::string corrupt = shard;
    corrupt[shard.size() - 1] ^= 1;
    ShardVerifier of_corrupt(plan);
    of_corrupt.CopyShard(3, corrupt.data(),
                         [&tensors](int tensor) { return tensors[tensor].data(); });
    EXPECT_TRUE(absl::IsDataLoss(of_corrupt.Finish()));
  }
}

TEST(ShardVerifierTest, ABadByteAMissingTensorOrOneOfferedTwiceIsDataLossNamingTheShard) {
  const std::string shard = ShardBytes();
  const internal::v1::GetReadPlanResponse plan = InterleavedPlan(shard);
  const std::string a = Landed(shard, 0);
  std::string b = Landed(shard, 1);
  const auto expect_loss = [](const absl::Status& status) {
    EXPECT_TRUE(absl::IsDataLoss(status)) << status;
    EXPECT_NE(status.message().find("shard 3"), absl::string_view::npos) << status;
  };
  ShardVerifier missing(plan);
  missing.OfferTensor(0, a.data());
  expect_loss(missing.Finish());
  ShardVerifier twice(plan);
  twice.OfferTensor(0, a.data());
  twice.OfferTensor(0, a.data());
  twice.OfferTensor(1, b.data());
  expect_loss(twice.Finish());
  b[100] ^= 1;
  ShardVerifier corrupt(plan);
  corrupt.OfferTensor(0, a.data());
  corrupt.OfferTensor(1, b.data());
  expect_loss(corrupt.Finish());
}

}  // namespace
}  // namespace tandem::weight_store
