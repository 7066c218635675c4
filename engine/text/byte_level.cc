#include "engine/text/byte_level.h"

#include <array>
#include <cstdint>

#include "absl/container/flat_hash_map.h"

namespace tandem::engine::text {
namespace {

constexpr bool StandsForItself(int byte) {
  return (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) ||
         (byte >= 0xAE && byte <= 0xFF);
}

// Code point of each byte's character, as GPT-2's bytes_to_unicode() builds it.
const std::array<char32_t, 256>& CodePoints() {
  static const auto* table = [] {
    auto* points = new std::array<char32_t, 256>();
    char32_t next_extra = 0x100;
    for (int byte = 0; byte < 256; ++byte) {
      (*points)[byte] = StandsForItself(byte) ? static_cast<char32_t>(byte) : next_extra++;
    }
    return points;
  }();
  return *table;
}

void AppendUtf8(char32_t point, std::string& out) {
  if (point < 0x80) {
    out.push_back(static_cast<char>(point));
  } else {  // The alphabet ends below U+0800: two bytes suffice.
    out.push_back(static_cast<char>(0xC0 | (point >> 6)));
    out.push_back(static_cast<char>(0x80 | (point & 0x3F)));
  }
}

}  // namespace

std::string ToByteLevel(absl::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char byte : bytes) AppendUtf8(CodePoints()[byte], out);
  return out;
}

std::optional<std::string> FromByteLevel(absl::string_view text) {
  static const auto* bytes_of = [] {
    auto* map = new absl::flat_hash_map<char32_t, char>();
    for (int byte = 0; byte < 256; ++byte) (*map)[CodePoints()[byte]] = static_cast<char>(byte);
    return map;
  }();
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    char32_t point;
    if (lead < 0x80) {
      point = lead;
      i += 1;
    } else if ((lead & 0xE0) == 0xC0 && i + 1 < text.size()) {
      point = (static_cast<char32_t>(lead & 0x1F) << 6) | (text[i + 1] & 0x3F);
      i += 2;
    } else {
      return std::nullopt;  // Three- and four-byte characters are never in the alphabet.
    }
    const auto found = bytes_of->find(point);
    if (found == bytes_of->end()) return std::nullopt;
    out.push_back(found->second);
  }
  return out;
}

}  // namespace tandem::engine::text
