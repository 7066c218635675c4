#ifndef TANDEM_ENGINE_TEXT_UTF8_STREAM_H_
#define TANDEM_ENGINE_TEXT_UTF8_STREAM_H_

#include <string>

#include "absl/strings/string_view.h"

namespace tandem::engine::text {

// Turns bytes that arrive in pieces (the bytes of each generated token) into text that never
// shows a broken character: a character split across tokens is held back until its last byte
// arrives, and bytes that can never form a character become U+FFFD, as Hugging Face's
// decoders do (String::from_utf8_lossy).
class Utf8Stream {
 public:
  // The complete characters that `bytes` finishes.
  std::string Append(absl::string_view bytes);
  // What is left at the end of the stream: U+FFFD for an unfinished character.
  std::string Finish();

 private:
  std::string pending_;
};

// `bytes` with every ill-formed sequence replaced by U+FFFD.
std::string LossyUtf8(absl::string_view bytes);

}  // namespace tandem::engine::text

#endif  // TANDEM_ENGINE_TEXT_UTF8_STREAM_H_
