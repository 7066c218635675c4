#ifndef TANDEM_COMMON_ADAPTER_SELECTOR_H_
#define TANDEM_COMMON_ADAPTER_SELECTOR_H_

#include "absl/status/status.h"
#include "tandem/v1/common.pb.h"

namespace tandem {

// common.proto's version rule of an AdapterSelector, shared by rollout and weight-store: a set
// exact_version or min_version is >= 1 (unset means the newest). INVALID_ARGUMENT naming the
// field and value, e.g. "adapter.exact_version is 0; must be >= 1". The name's rule differs
// by service (rollout takes an empty name as the base model), so callers check it.
absl::Status ValidateSelectorVersion(const v1::AdapterSelector& selector);

}  // namespace tandem

#endif  // TANDEM_COMMON_ADAPTER_SELECTOR_H_
