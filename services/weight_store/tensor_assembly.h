#ifndef TANDEM_SERVICES_WEIGHT_STORE_TENSOR_ASSEMBLY_H_
#define TANDEM_SERVICES_WEIGHT_STORE_TENSOR_ASSEMBLY_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "services/weight_store/version_files.h"
#include "tandem/internal/v1/weight_store_ucx.pb.h"
#include "tandem/weightstore/v1/weight_store.pb.h"

namespace tandem::weight_store {

// Assembles one planned target tensor from a committed version's shards (stored dtype).
std::string AssembleTensor(const internal::v1::PlannedTensor& tensor,
                           const CommittedVersion& version);

// The XXH3-64 of what AssembleTensor returns, hashed block by block in the tensor's byte order
// straight from the shards: no pass writing a copy of the tensor.
uint64_t TensorChecksum(const internal::v1::PlannedTensor& tensor,
                        const CommittedVersion& version);

}  // namespace tandem::weight_store

#endif  // TANDEM_SERVICES_WEIGHT_STORE_TENSOR_ASSEMBLY_H_
