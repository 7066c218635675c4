#ifndef TANDEM_ENGINE_TOKENIZER_H_
#define TANDEM_ENGINE_TOKENIZER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::engine {

// Character tokenizer for the synthetic tasks: one token per character of a fixed alphabet,
// after three special tokens. The order below is the id order and is part of every saved
// model (embedding rows are indexed by it), so it must never change.
inline constexpr int kPadId = 0;
inline constexpr int kBosId = 1;
inline constexpr int kEosId = 2;
inline constexpr int kNumSpecialTokens = 3;
// Digits first, then arithmetic and separator symbols (the space is id 21), then a-z.
inline constexpr char kAlphabet[] = "0123456789+-=*<>|: ,abcdefghijklmnopqrstuvwxyz";
inline constexpr int kVocabSize = kNumSpecialTokens + static_cast<int>(sizeof(kAlphabet)) - 1;

// Ids of the characters of `text`, without <bos> or <eos> (callers frame sequences themselves).
// INVALID_ARGUMENT naming the first character outside the alphabet and its position.
absl::StatusOr<std::vector<int>> Encode(absl::string_view text);

// <bos> followed by the prompt's characters: how every task prompt enters the model.
absl::StatusOr<std::vector<int>> PromptTokens(absl::string_view prompt);

// How SpecialTokens::kRender writes each special token, indexed by id.
inline constexpr const char* kSpecialTokenText[kNumSpecialTokens] = {"<pad>", "<bos>", "<eos>"};

enum class SpecialTokens {
  kSkip,  // Special tokens contribute nothing: the text a user would read.
  // "<pad>", "<bos>", "<eos>": keeps the end of a completion visible (see Task::Reward). For
  // display and rewards only: Encode reads these back as plain characters, not special ids.
  kRender,
};

// The text of `ids`. An id outside [0, kVocabSize) can only come from a bug elsewhere; it
// decodes to '?', which is outside the alphabet, so it can never form a correct answer.
std::string Decode(const std::vector<int>& ids, SpecialTokens special = SpecialTokens::kSkip);

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_TOKENIZER_H_
