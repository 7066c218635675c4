#include "common/identifier.h"

#include <algorithm>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "common/utf8.h"

namespace tandem {

bool IsIdentifier(absl::string_view value) {
  const bool allowed_bytes =
      !value.empty() && value.size() <= kMaxIdentifierBytes &&
      std::all_of(value.begin(), value.end(), [](char c) {
        return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == ':' || c == '/' || c == '-';
      });
  // Names become directory names (weight-store): no "." or ".." path segment, no "..".
  const std::vector<absl::string_view> segments = absl::StrSplit(value, '/');
  return allowed_bytes && value.find("..") == absl::string_view::npos &&
         std::none_of(segments.begin(), segments.end(),
                      [](absl::string_view segment) { return segment == "."; });
}

absl::Status ValidateIdentifier(absl::string_view field, absl::string_view value) {
  if (IsIdentifier(value)) return absl::OkStatus();
  return InvalidField(
      field, absl::StrCat("bad ", field, ": '", ValidUtf8(value.substr(0, kMaxIdentifierBytes)),
                          value.size() > kMaxIdentifierBytes ? "...' (" : "' (", value.size(),
                          " bytes; identifiers are 1-128 bytes from [A-Za-z0-9._:/-], without "
                          "'..')"));
}

}  // namespace tandem
