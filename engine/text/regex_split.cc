#include "engine/text/regex_split.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/strings/str_cat.h"

namespace tandem::engine::text {

// Owns the compiled pattern.
struct RegexSplit::Code {
  explicit Code(pcre2_code* compiled) : code(compiled) {}
  Code(const Code&) = delete;
  Code& operator=(const Code&) = delete;
  ~Code() { pcre2_code_free(code); }

  pcre2_code* const code;
};

absl::StatusOr<RegexSplit> RegexSplit::Compile(absl::string_view pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat("split pattern does not compile at offset ",
                                                   offset, ": ",
                                                   reinterpret_cast<const char*>(message)));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // Without JIT, matching is slower, not wrong.
  return RegexSplit(std::make_shared<const Code>(code));
}

std::vector<absl::string_view> RegexSplit::Split(absl::string_view text) const {
  std::vector<absl::string_view> pieces;
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
      pcre2_match_data_create_from_pattern(code_->code, nullptr), &pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;      // Where the next search begins.
  size_t unmatched = 0;  // Where the stretch since the last match begins.
  while (start < text.size()) {
    const int found = pcre2_match(code_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK,
                                  match.get(), nullptr);
    if (found < 0) break;
    const PCRE2_SIZE* bounds = pcre2_get_ovector_pointer(match.get());
    const size_t begin = bounds[0];
    const size_t end = bounds[1];
    if (begin > unmatched) pieces.push_back(text.substr(unmatched, begin - unmatched));
    if (end > begin) {
      pieces.push_back(text.substr(begin, end - begin));
      start = unmatched = end;
    } else {  // An empty match cuts here but is no piece; search on from the next character.
      start = end + 1;
      while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) {
        ++start;
      }
      unmatched = begin;
    }
  }
  if (unmatched < text.size()) pieces.push_back(text.substr(unmatched));
  return pieces;
}

}  // namespace tandem::engine::text
