#include "engine/text/utf8_stream.h"

namespace tandem::engine::text {
namespace {

constexpr absl::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

struct ByteRange {
  unsigned char low;
  unsigned char high;
};

// What starts at s[i]: a well-formed character of `length` bytes; a prefix of one that the
// end of `s` cuts short (length 0); or an ill-formed maximal subpart of -length bytes, which
// becomes one U+FFFD (Unicode's "maximal subpart" practice, as from_utf8_lossy does).
int Classify(absl::string_view s, size_t i) {
  const auto lead = static_cast<unsigned char>(s[i]);
  int length;
  ByteRange second{0x80, 0xBF};
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) second = {0xA0, 0xBF};  // No overlong forms.
    if (lead == 0xED) second = {0x80, 0x9F};  // No surrogates.
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) second = {0x90, 0xBF};
    if (lead == 0xF4) second = {0x80, 0x8F};  // Nothing above U+10FFFF.
  } else {
    return -1;
  }
  for (int k = 1; k < length; ++k) {
    if (i + k >= s.size()) return 0;
    const auto byte = static_cast<unsigned char>(s[i + k]);
    const ByteRange range = k == 1 ? second : ByteRange{0x80, 0xBF};
    if (byte < range.low || byte > range.high) return -k;
  }
  return length;
}

// Appends the text of s[0, end) to `out`; returns where an unfinished last character begins
// (s.size() when there is none).
size_t AppendComplete(absl::string_view s, std::string& out) {
  size_t i = 0;
  while (i < s.size()) {
    const int length = Classify(s, i);
    if (length == 0) return i;
    if (length > 0) {
      out.append(s.data() + i, static_cast<size_t>(length));
      i += length;
    } else {
      out.append(kReplacement.data(), kReplacement.size());
      i += -length;
    }
  }
  return i;
}

}  // namespace

std::string Utf8Stream::Append(absl::string_view bytes) {
  pending_.append(bytes.data(), bytes.size());
  std::string text;
  pending_.erase(0, AppendComplete(pending_, text));
  return text;
}

std::string Utf8Stream::Finish() {
  std::string text = pending_.empty() ? "" : std::string(kReplacement);
  pending_.clear();
  return text;
}

std::string LossyUtf8(absl::string_view bytes) {
  Utf8Stream stream;
  std::string text = stream.Append(bytes);
  return text + stream.Finish();
}

}  // namespace tandem::engine::text
