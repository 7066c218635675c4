#ifndef TANDEM_COMMON_IDENTIFIER_H_
#define TANDEM_COMMON_IDENTIFIER_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tandem {

// The identifier rule of common.proto, shared by every service: job ids, adapter names,
// sample ids, request ids, upload ids and lease ids are 1-128 bytes from [A-Za-z0-9._:/-]
// (so never spaces), without "..", and without a "." path segment: names become directory
// names, which must never climb out of or alias their parent.
inline constexpr size_t kMaxIdentifierBytes = 128;

bool IsIdentifier(absl::string_view value);

// INVALID_ARGUMENT "bad <field>: '<value>' (identifiers are ...)" unless IsIdentifier(value).
absl::Status ValidateIdentifier(absl::string_view field, absl::string_view value);

}  // namespace tandem

#endif  // TANDEM_COMMON_IDENTIFIER_H_
