#include "engine/tokenizer.h"

#include <array>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace tandem::engine {
namespace {

constexpr int kNoId = -1;

// Byte -> id, built at compile time so Encode is one lookup per character.
constexpr std::array<int, 256> MakeIdTable() {
  std::array<int, 256> table{};
  table.fill(kNoId);
  for (int i = 0; kAlphabet[i] != '\0'; ++i) {
    table[static_cast<unsigned char>(kAlphabet[i])] = kNumSpecialTokens + i;
  }
  return table;
}

constexpr std::array<int, 256> kIdOf = MakeIdTable();

}  // namespace

absl::StatusOr<std::vector<int>> Encode(absl::string_view text) {
  std::vector<int> ids;
  ids.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const int id = kIdOf[static_cast<unsigned char>(text[i])];
    if (id == kNoId) {
      return absl::InvalidArgumentError(
          absl::StrCat("character '", absl::CHexEscape(text.substr(i, 1)), "' at position ", i,
                       " is not in the tokenizer alphabet \"", kAlphabet, "\""));
    }
    ids.push_back(id);
  }
  return ids;
}

absl::StatusOr<std::vector<int>> PromptTokens(absl::string_view prompt) {
  auto encoded = Encode(prompt);
  if (!encoded.ok()) return encoded.status();
  encoded->insert(encoded->begin(), kBosId);
  return encoded;
}

std::string Decode(const std::vector<int>& ids, SpecialTokens special) {
  std::string text;
  text.reserve(ids.size());
  for (const int id : ids) {
    if (id < 0 || id >= kVocabSize) {
      text.push_back('?');
    } else if (id >= kNumSpecialTokens) {
      text.push_back(kAlphabet[id - kNumSpecialTokens]);
    } else if (special == SpecialTokens::kRender) {
      text.append(kSpecialTokenText[id]);
    }
  }
  return text;
}

}  // namespace tandem::engine
