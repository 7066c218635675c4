#include "common/adapter_selector.h"

#include "absl/strings/str_cat.h"

namespace tandem {

absl::Status ValidateSelectorVersion(const v1::AdapterSelector& selector) {
  if (selector.has_exact_version() && selector.exact_version() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("adapter.exact_version is ", selector.exact_version(), "; must be >= 1"));
  }
  if (selector.has_min_version() && selector.min_version() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("adapter.min_version is ", selector.min_version(), "; must be >= 1"));
  }
  return absl::OkStatus();
}

}  // namespace tandem
