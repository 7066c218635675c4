#ifndef TANDEM_COMMON_UTF8_H_
#define TANDEM_COMMON_UTF8_H_

#include <string>

#include "absl/strings/string_view.h"

namespace tandem {

// True when `bytes` is well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing
// above U+10FFFF), as protobuf requires of every proto3 string field.
bool IsValidUtf8(absl::string_view bytes);

// `bytes` made safe for a proto string field: well-formed UTF-8 is returned unchanged; every
// byte that is not part of a well-formed sequence becomes the four characters "\xNN". Use it
// for text that may carry outside bytes (error messages quoting a file, a peer's reply) before
// it reaches a message; a string field with invalid UTF-8 makes the whole message unreadable.
std::string ValidUtf8(absl::string_view bytes);

}  // namespace tandem

#endif  // TANDEM_COMMON_UTF8_H_
