#include "services/weight_store/tensor_assembly.h"

#include <vector>

#include "services/weight_store/reshard.h"

namespace tandem::weight_store {

std::string AssembleTensor(const v1::PlannedTensor& tensor, const CommittedVersion& version) {
  std::vector<absl::string_view> shards;
  for (const auto& shard : version.shards) shards.push_back(shard->bytes());
  std::string bytes(tensor.tensor().byte_size(), '\0');
  ExecuteOps(tensor, shards, bytes.data());
  return bytes;
}

}  // namespace tandem::weight_store
