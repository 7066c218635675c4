// TensorChecksum against the checksum of the assembled tensor, for target layouts whose tensors
// take their blocks from several shards in interleaved order (a TP 2 x EP 2 producer read
// whole, sliced and stacked).
#include "services/weight_store/tensor_assembly.h"

#include <cstring>
#include <memory>
#include <vector>

#include "common/checksum.h"
#include "gtest/gtest.h"
#include "services/weight_store/reshard.h"
#include "transfer/lora_testing.h"

namespace tandem::weight_store {
namespace {

CommittedVersion VersionOf(const transfer::TestAdapter& adapter) {
  CommittedVersion version;
  version.manifest = adapter.manifest;
  for (const std::string& shard : adapter.shards) {
    std::unique_ptr<ShardBuffer> buffer = *ShardBuffer::Allocate(nullptr, shard.size());
    std::memcpy(buffer->data(), shard.data(), shard.size());
    version.shards.push_back(std::move(buffer));
  }
  return version;
}

weightstore::v1::TargetLayout Layout(int tp_rank, int tp_size, int ep_rank, int ep_size,
                                     bool fuse_gate_up, bool stack_experts) {
  weightstore::v1::TargetLayout target;
  target.set_tp_rank(tp_rank);
  target.set_tp_size(tp_size);
  target.set_ep_rank(ep_rank);
  target.set_ep_size(ep_size);
  target.set_fuse_gate_up(fuse_gate_up);
  target.set_stack_experts(stack_experts);
  return target;
}

TEST(TensorAssemblyTest, ChecksumIsTheAssembledTensorsWithoutAssemblingIt) {
  const CommittedVersion version = VersionOf(transfer::MakeTestAdapter("a", 1, 7));
  ASSERT_GT(version.shards.size(), 1);
  int interleaved = 0;  // Tensors whose blocks alternate between shards.
  for (const weightstore::v1::TargetLayout& target :
       {Layout(0, 1, 0, 1, false, false), Layout(0, 1, 0, 1, true, true),
        Layout(1, 2, 1, 2, false, true), Layout(0, 4, 0, 1, true, false)}) {
    SCOPED_TRACE(target.ShortDebugString());
    absl::StatusOr<std::vector<internal::v1::PlannedTensor>> plan =
        PlanReads(version.manifest, target, /*tensor_names=*/{});
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (const internal::v1::PlannedTensor& tensor : *plan) {
      EXPECT_EQ(TensorChecksum(tensor, version), Xxh3Checksum(AssembleTensor(tensor, version)))
          << tensor.tensor().spec().name();
      interleaved += tensor.ops_size() > 1 && tensor.ops(0).count() > 1;
    }
  }
  EXPECT_GT(interleaved, 0) << "no layout exercised blocks out of destination order";
}

}  // namespace
}  // namespace tandem::weight_store
