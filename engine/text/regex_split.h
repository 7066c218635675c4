#ifndef TANDEM_ENGINE_TEXT_REGEX_SPLIT_H_
#define TANDEM_ENGINE_TEXT_REGEX_SPLIT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::engine::text {

// The Split pre-tokenizer of Hugging Face tokenizers with behavior "Isolated": the text is cut
// into the pattern's matches and the stretches between them, each a piece of its own. The
// pattern is compiled by PCRE2 in UTF mode with Unicode properties (\p{L}, \s and \w follow
// Unicode, as Oniguruma's do in the tokenizers crate), JIT-compiled where the CPU allows.
class RegexSplit {
 public:
  // INVALID_ARGUMENT with PCRE2's message and offset when `pattern` does not compile.
  static absl::StatusOr<RegexSplit> Compile(absl::string_view pattern);

  // The pieces of `text` (views into it), in order; they concatenate to `text`. `text` must be
  // valid UTF-8.
  std::vector<absl::string_view> Split(absl::string_view text) const;

 private:
  struct Code;
  explicit RegexSplit(std::shared_ptr<const Code> code) : code_(std::move(code)) {}

  std::shared_ptr<const Code> code_;  // Immutable and thread-safe once compiled.
};

}  // namespace tandem::engine::text

#endif  // TANDEM_ENGINE_TEXT_REGEX_SPLIT_H_
