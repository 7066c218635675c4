#ifndef TANDEM_COMMON_STRING_LIMITS_H_
#define TANDEM_COMMON_STRING_LIMITS_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tandem {

// The size classes of common.proto's string rule: every string a service takes from outside has
// a maximum, so no stored record, and no page of them, can outgrow a message. Identifiers have
// their own rule (identifier.h, 128 bytes).
inline constexpr size_t kMaxNameBytes = 256;      // Display names, field and label names.
inline constexpr size_t kMaxAddressBytes = 1024;  // "host:port", "dns:///name:port", "unix:/path".
inline constexpr size_t kMaxPathBytes = 4096;     // File and directory paths (PATH_MAX).
inline constexpr size_t kMaxTextBytes = 4096;     // Free text: label values, parameters.

// INVALID_ARGUMENT "<field> has <n> bytes; at most <max_bytes>" when `value` is longer. The
// value itself is not repeated: it is what was too long.
absl::Status CheckMaxBytes(absl::string_view field, absl::string_view value, size_t max_bytes);

}  // namespace tandem

#endif  // TANDEM_COMMON_STRING_LIMITS_H_
