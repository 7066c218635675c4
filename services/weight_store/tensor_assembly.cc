#include "services/weight_store/tensor_assembly.h"

#include <algorithm>
#include <vector>

#include "common/checksum.h"
#include "services/weight_store/reshard.h"

namespace tandem::weight_store {

std::string AssembleTensor(const v1::PlannedTensor& tensor, const CommittedVersion& version) {
  std::vector<absl::string_view> shards;
  for (const auto& shard : version.shards) shards.push_back(shard->bytes());
  std::string bytes(tensor.tensor().byte_size(), '\0');
  ExecuteOps(tensor, shards, bytes.data());
  return bytes;
}

uint64_t TensorChecksum(const v1::PlannedTensor& tensor, const CommittedVersion& version) {
  struct Block {
    uint64_t dst_offset;
    absl::string_view bytes;
  };
  std::vector<Block> blocks;
  for (const v1::CopyOp& op : tensor.ops()) {
    const char* shard = version.shards[op.shard_index()]->data();
    for (uint64_t i = 0; i < op.count(); ++i) {
      blocks.push_back({op.dst_offset() + i * op.dst_stride(),
                        {shard + op.src_offset() + i * op.src_stride(), op.length()}});
    }
  }
  // The ops cover every byte of the tensor exactly once, so its blocks in destination order
  // are the tensor's bytes in order.
  std::sort(blocks.begin(), blocks.end(),
            [](const Block& a, const Block& b) { return a.dst_offset < b.dst_offset; });
  Xxh3Hasher hasher;
  for (const Block& block : blocks) hasher.Update(block.bytes);
  return hasher.Digest();
}

}  // namespace tandem::weight_store
