#include "common/string_limits.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem {

absl::Status CheckMaxBytes(absl::string_view field, absl::string_view value, size_t max_bytes) {
  if (value.size() <= max_bytes) return absl::OkStatus();
  return InvalidField(field,
                      absl::StrCat(field, " has ", value.size(), " bytes; at most ", max_bytes));
}

}  // namespace tandem
