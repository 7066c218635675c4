#include "services/weight_store/tensor_assembly.h"

#include <vector>

#include "common/checksum.h"
#include "services/weight_store/client/read_plan.h"
#include "services/weight_store/reshard.h"

namespace tandem::weight_store {

std::string AssembleTensor(const internal::v1::PlannedTensor& tensor,
                           const CommittedVersion& version) {
  std::vector<absl::string_view> shards;
  for (const auto& shard : version.shards) shards.push_back(shard->bytes());
  std::string bytes(tensor.tensor().byte_size(), '\0');
  ExecuteOps(tensor, shards, bytes.data());
  return bytes;
}

uint64_t TensorChecksum(const internal::v1::PlannedTensor& tensor,
                        const CommittedVersion& version) {
  // The ops cover every byte of the tensor exactly once, so its blocks in destination order
  // are the tensor's bytes in order.
  Xxh3Hasher hasher;
  for (const PlannedBlock& block : BlocksInDestinationOrder(
           tensor, [&version](int shard) { return version.shards[shard]->data(); })) {
    hasher.Update(absl::string_view(block.source, block.length));
  }
  return hasher.Digest();
}

}  // namespace tandem::weight_store
