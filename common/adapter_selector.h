#ifndef TANDEM_COMMON_ADAPTER_SELECTOR_H_
#define TANDEM_COMMON_ADAPTER_SELECTOR_H_

#include "absl/status/status.h"
#include "tandem/type/v1/common.pb.h"

namespace tandem {

// common.proto's rules for an AdapterSelector that names an adapter, shared by rollout and
// weight-store: adapter_name is an identifier, and a set exact_version or min_version is >= 1
// (unset means the newest). INVALID_ARGUMENT naming the field and value, e.g.
// "adapter.exact_version is 0; must be >= 1", its details naming the field by its path from the
// request root (both requests carry the selector as `adapter`). An empty name is the base model
// to a rollout and an error to weight-store, so that case is the callers'.
absl::Status ValidateNamedSelector(const type::v1::AdapterSelector& selector);

}  // namespace tandem

#endif  // TANDEM_COMMON_ADAPTER_SELECTOR_H_
