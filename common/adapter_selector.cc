#include "common/adapter_selector.h"

#include "absl/strings/str_cat.h"
#include "common/identifier.h"
#include "common/status.h"

namespace tandem {

absl::Status ValidateNamedSelector(const type::v1::AdapterSelector& selector) {
  if (absl::Status status = ValidateIdentifier("adapter.adapter_name", selector.adapter_name());
      !status.ok()) {
    return status;
  }
  if (selector.has_exact_version() && selector.exact_version() < 1) {
    return InvalidField(
        "adapter.exact_version",
        absl::StrCat("adapter.exact_version is ", selector.exact_version(), "; must be >= 1"));
  }
  if (selector.has_min_version() && selector.min_version() < 1) {
    return InvalidField(
        "adapter.min_version",
        absl::StrCat("adapter.min_version is ", selector.min_version(), "; must be >= 1"));
  }
  return absl::OkStatus();
}

}  // namespace tandem
