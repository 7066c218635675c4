#include "engine/text/bpe_model.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tandem::engine::text {
namespace {

constexpr size_t kCacheEntries = 1 << 16;  // Cleared when full: words are cheap to redo.

absl::Status Invalid(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("tokenizer.json model", field.empty() ? "" : ".", field, ": ", why));
}

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

size_t Utf8Length(unsigned char lead) {
  if (lead < 0xC0) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

// A merge is ["a", "b"] in newer files and "a b" in older ones.
absl::StatusOr<std::pair<std::string, std::string>> MergeParts(const nlohmann::json& merge) {
  if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
    return std::pair(merge[0].get<std::string>(), merge[1].get<std::string>());
  }
  if (merge.is_string()) {
    std::pair<std::string, std::string> parts =
        absl::StrSplit(merge.get<std::string>(), absl::MaxSplits(' ', 1));
    if (!parts.second.empty()) return parts;
  }
  return Invalid("merges", absl::StrCat("not a pair: ", merge.dump()));
}

absl::Status CheckSupported(const nlohmann::json& model) {
  if (model.value("type", "BPE") != "BPE") {
    return Invalid("type", absl::StrCat("only BPE is supported, not ", model["type"].dump()));
  }
  if (model.contains("dropout") && !model["dropout"].is_null()) {
    return Invalid("dropout", "BPE dropout is not supported");
  }
  if (model.value("byte_fallback", false)) {
    return Invalid("byte_fallback", "byte fallback is not supported");
  }
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(affix) && model[affix].is_string() &&
        !model[affix].get<std::string>().empty()) {
      return Invalid(affix, "subword prefixes and suffixes are not supported");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<BpeModel> BpeModel::FromJson(const nlohmann::json& model) {
  try {
    return Parse(model);
  } catch (const nlohmann::json::exception& error) {  // A field of the wrong JSON type.
    return Invalid("", error.what());
  }
}

absl::StatusOr<BpeModel> BpeModel::Parse(const nlohmann::json& model) {
  if (!model.is_object()) return Invalid("", "not an object");
  if (absl::Status status = CheckSupported(model); !status.ok()) return status;
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return Invalid("vocab", "missing or not an object");
  }
  BpeModel bpe;
  const nlohmann::json& vocab = model["vocab"];
  bpe.vocab_.reserve(vocab.size());
  bpe.tokens_.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() >= std::numeric_limits<int32_t>::max()) {
      return Invalid("vocab", absl::StrCat("token ", token, " has id ", id.dump()));
    }
    const auto index = id.get<int32_t>();
    if (static_cast<size_t>(index) >= bpe.tokens_.size()) bpe.tokens_.resize(index + 1);
    bpe.tokens_[index] = token;
    bpe.vocab_[token] = index;
  }
  static const nlohmann::json kNoMerges = nlohmann::json::array();
  // By reference: a copy of a large vocabulary's merges costs more than reading them.
  const nlohmann::json& merges = model.contains("merges") ? model["merges"] : kNoMerges;
  if (!merges.is_array()) return Invalid("merges", "not an array");
  bpe.merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    auto parts = MergeParts(merges[rank]);
    if (!parts.ok()) return parts.status();
    const auto left = bpe.vocab_.find(parts->first);
    const auto right = bpe.vocab_.find(parts->second);
    const auto merged = bpe.vocab_.find(parts->first + parts->second);
    if (left == bpe.vocab_.end() || right == bpe.vocab_.end() || merged == bpe.vocab_.end()) {
      return Invalid("merges", absl::StrCat("merge ", rank, " (", merges[rank].dump(),
                                            ") names a token outside the vocabulary"));
    }
    // The first occurrence of a pair is its rank, as in the tokenizers crate.
    bpe.merges_.try_emplace(PairKey(left->second, right->second),
                            Merge{static_cast<int32_t>(rank), merged->second});
  }
  bpe.ignore_merges_ = model.value("ignore_merges", false);
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const auto unk = bpe.vocab_.find(model["unk_token"].get<std::string>());
    if (unk == bpe.vocab_.end()) return Invalid("unk_token", "not in the vocabulary");
    bpe.unk_id_ = unk->second;
  }
  return bpe;
}

BpeModel::BpeModel(BpeModel&& other) noexcept
    : vocab_(std::move(other.vocab_)),
      tokens_(std::move(other.tokens_)),
      merges_(std::move(other.merges_)),
      ignore_merges_(other.ignore_merges_),
      unk_id_(other.unk_id_) {}

const std::string* BpeModel::Token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= tokens_.size() || tokens_[id].empty()) return nullptr;
  return &tokens_[id];
}

absl::Status BpeModel::AppendIds(absl::string_view word, std::vector<int32_t>& ids) const {
  {
    absl::MutexLock lock(&cache_mutex_);
    if (const auto cached = cache_.find(word); cached != cache_.end()) {
      ids.insert(ids.end(), cached->second.begin(), cached->second.end());
      return absl::OkStatus();
    }
  }
  std::vector<int32_t> word_ids;
  if (absl::Status status = Tokenize(word, word_ids); !status.ok()) return status;
  ids.insert(ids.end(), word_ids.begin(), word_ids.end());
  absl::MutexLock lock(&cache_mutex_);
  if (cache_.size() >= kCacheEntries) cache_.clear();
  cache_.emplace(word, std::move(word_ids));
  return absl::OkStatus();
}

absl::Status BpeModel::Tokenize(absl::string_view word, std::vector<int32_t>& ids) const {
  if (ignore_merges_) {
    if (const auto whole = vocab_.find(word); whole != vocab_.end()) {
      ids.push_back(whole->second);
      return absl::OkStatus();
    }
  }
  std::vector<int32_t> symbols;
  for (size_t i = 0; i < word.size();) {
    const absl::string_view character = word.substr(i, Utf8Length(word[i]));
    i += character.size();
    const auto found = vocab_.find(character);
    if (found != vocab_.end()) {
      symbols.push_back(found->second);
    } else if (unk_id_ >= 0) {
      symbols.push_back(unk_id_);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "character '", character, "' is not in the vocabulary, which has no unk_token"));
    }
  }
  // Merge the lowest-ranked adjacent pair, the leftmost on ties, until none has a merge.
  while (symbols.size() > 1) {
    size_t best = symbols.size();
    Merge best_merge{std::numeric_limits<int32_t>::max(), -1};
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const auto merge = merges_.find(PairKey(symbols[i], symbols[i + 1]));
      if (merge != merges_.end() && merge->second.rank < best_merge.rank) {
        best = i;
        best_merge = merge->second;
      }
    }
    if (best == symbols.size()) break;
    symbols[best] = best_merge.merged;
    symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  ids.insert(ids.end(), symbols.begin(), symbols.end());
  return absl::OkStatus();
}

}  // namespace tandem::engine::text
