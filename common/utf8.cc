#include "common/utf8.h"

#include <cstdint>

#include "absl/strings/str_format.h"

namespace tandem {
namespace {

// Length of the well-formed UTF-8 sequence at the start of `bytes`, or 0 if there is none.
size_t SequenceLength(absl::string_view bytes) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(bytes[i]); };
  const auto continuation = [&](size_t i) { return i < bytes.size() && (byte(i) & 0xC0) == 0x80; };
  const uint8_t lead = byte(0);
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return continuation(1) ? 2 : 0;
  if (lead >= 0xE0 && lead <= 0xEF) {
    if (!continuation(1) || !continuation(2)) return 0;
    if (lead == 0xE0 && byte(1) < 0xA0) return 0;  // Overlong.
    if (lead == 0xED && byte(1) > 0x9F) return 0;  // UTF-16 surrogates.
    return 3;
  }
  if (lead >= 0xF0 && lead <= 0xF4) {
    if (!continuation(1) || !continuation(2) || !continuation(3)) return 0;
    if (lead == 0xF0 && byte(1) < 0x90) return 0;  // Overlong.
    if (lead == 0xF4 && byte(1) > 0x8F) return 0;  // Above U+10FFFF.
    return 4;
  }
  return 0;  // A continuation byte, an overlong lead (C0, C1) or F5..FF.
}

}  // namespace

bool IsValidUtf8(absl::string_view bytes) {
  while (!bytes.empty()) {
    const size_t length = SequenceLength(bytes);
    if (length == 0) return false;
    bytes.remove_prefix(length);
  }
  return true;
}

std::string ValidUtf8(absl::string_view bytes) {
  if (IsValidUtf8(bytes)) return std::string(bytes);
  std::string out;
  out.reserve(bytes.size() + 16);
  while (!bytes.empty()) {
    const size_t length = SequenceLength(bytes);
    if (length == 0) {
      absl::StrAppendFormat(&out, "\\x%02X", static_cast<uint8_t>(bytes[0]));
      bytes.remove_prefix(1);
    } else {
      out.append(bytes.data(), length);
      bytes.remove_prefix(length);
    }
  }
  return out;
}

}  // namespace tandem
