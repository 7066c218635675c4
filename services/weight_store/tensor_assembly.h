#ifndef TANDEM_SERVICES_WEIGHT_STORE_TENSOR_ASSEMBLY_H_
#define TANDEM_SERVICES_WEIGHT_STORE_TENSOR_ASSEMBLY_H_

#include <string>

#include "absl/status/statusor.h"
#include "services/weight_store/version_files.h"
#include "tandem/v1/weight_store.pb.h"

namespace tandem::weight_store {

// Assembles one planned target tensor from a committed version's shards (stored dtype).
std::string AssembleTensor(const v1::PlannedTensor& tensor, const CommittedVersion& version);

}  // namespace tandem::weight_store

#endif  // TANDEM_SERVICES_WEIGHT_STORE_TENSOR_ASSEMBLY_H_
