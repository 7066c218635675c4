#ifndef TANDEM_ENGINE_TEXT_BYTE_LEVEL_H_
#define TANDEM_ENGINE_TEXT_BYTE_LEVEL_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace tandem::engine::text {

// GPT-2's byte-level alphabet, used by the ByteLevel pre-tokenizer and decoder of Hugging Face
// tokenizers: each of the 256 bytes is one printable character, so a BPE vocabulary can spell
// any byte string as text. Printable Latin-1 bytes stand for themselves; the other 68 bytes
// become U+0100 onward in byte order (the space is "Ġ", U+0120).

// `bytes` spelled in the alphabet (UTF-8 of one character per byte).
std::string ToByteLevel(absl::string_view bytes);

// The bytes a byte-level spelling stands for; nullopt when `text` holds a character outside
// the alphabet.
std::optional<std::string> FromByteLevel(absl::string_view text);

}  // namespace tandem::engine::text

#endif  // TANDEM_ENGINE_TEXT_BYTE_LEVEL_H_
