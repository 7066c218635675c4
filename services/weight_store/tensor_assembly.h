#ifndef TANDEM_SERVICES_WEIGHT_STORE_TENSOR_ASSEMBLY_H_
#define TANDEM_SERVICES_WEIGHT_STORE_TENSOR_ASSEMBLY_H_

#include <string>

#include "absl/status/statusor.h"
#include "services/weight_store/version_files.h"
#include "tandem/v1/weight_store.pb.h"

namespace tandem::weight_store {

// Assembles one planned target tensor from a committed version's shards (stored dtype).
std::string AssembleTensor(const v1::PlannedTensor& tensor, const CommittedVersion& version);

// Converts floating-point tensor bytes between F32, BF16 and F16 (round to nearest even);
// UNSPECIFIED or equal dtypes return the bytes unchanged. INVALID_ARGUMENT otherwise.
absl::StatusOr<std::string> ConvertFloats(std::string bytes, v1::DType from, v1::DType to);

}  // namespace tandem::weight_store

#endif  // TANDEM_SERVICES_WEIGHT_STORE_TENSOR_ASSEMBLY_H_
