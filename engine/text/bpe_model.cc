#include "engine/text/bpe_model.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tandem::engine::text {
namespace {

constexpr size_t kCacheEntries = 1 << 16;  // Cleared when full: words are cheap to redo.

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
absl::StatusOr<std::pair<std::string, std::string>> MergeParts(const nlohmann::json& merge,
                                                               size_t rank) {
  if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
    return std::pair(merge[0].get<std::string>(), merge[1].get<std::string>());
  }
  if (merge.is_string()) {
    if (auto parts = SplitMerge(merge.get<std::string>()); parts.has_value()) return *parts;
  }
  return BpeFieldError("merges", absl::StrCat("merge ", rank, " is not a pair: ", merge.dump()));
}

// The tables of a whole "model" object.
absl::StatusOr<BpeTables> TablesOf(const nlohmann::json& model) {
  BpeTables tables;
  if (model.contains("vocab") && model["vocab"].is_object()) {
    tables.has_vocab = true;
    tables.vocab.reserve(model["vocab"].size());
    for (const auto& [token, id] : model["vocab"].items()) {
      if (!id.is_number_integer()) {
        return BpeFieldError("vocab", absl::StrCat("token ", token, " has id ", id.dump()));
      }
      tables.vocab.emplace_back(token, id.get<int64_t>());
    }
  }
  if (model.contains("merges") && model["merges"].is_array()) {
    const nlohmann::json& merges = model["merges"];
    tables.merges.reserve(merges.size());
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      auto parts = MergeParts(merges[rank], rank);
      if (!parts.ok()) return parts.status();
      tables.merges.push_back(*std::move(parts));
    }
  }
  return tables;
}

absl::Status CheckSupported(const nlohmann::json& model) {
  if (model.value("type", "BPE") != "BPE") {
    return BpeFieldError("type", absl::StrCat("only BPE is supported, not ", model["type"].dump()));
  }
  if (model.contains("dropout") && !model["dropout"].is_null()) {
    return BpeFieldError("dropout", "BPE dropout is not supported");
  }
  if (model.value("byte_fallback", false)) {
    return BpeFieldError("byte_fallback", "byte fallback is not supported");
  }
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(affix) && model[affix].is_string() &&
        !model[affix].get<std::string>().empty()) {
      return BpeFieldError(affix, "subword prefixes and suffixes are not supported");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status BpeFieldError(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("tokenizer.json model", field.empty() ? "" : ".", field, ": ", why));
}

std::optional<std::pair<std::string, std::string>> SplitMerge(absl::string_view merge) {
  std::pair<std::string, std::string> parts = absl::StrSplit(merge, absl::MaxSplits(' ', 1));
  if (parts.second.empty()) return std::nullopt;
  return parts;
}

absl::StatusOr<BpeModel> BpeModel::FromJson(const nlohmann::json& model) {
  if (!model.is_object()) return BpeFieldError("", "not an object");
  absl::StatusOr<BpeTables> tables = TablesOf(model);
  if (!tables.ok()) return tables.status();
  return FromJson(model, *tables);
}

absl::StatusOr<BpeModel> BpeModel::FromJson(const nlohmann::json& model, const BpeTables& tables) {
  try {
    return Build(model, tables);
  } catch (const nlohmann::json::exception& error) {  // A field of the wrong JSON type.
    return BpeFieldError("", error.what());
  }
}

absl::StatusOr<BpeModel> BpeModel::Build(const nlohmann::json& model, const BpeTables& tables) {
  if (!model.is_object()) return BpeFieldError("", "not an object");
  if (absl::Status status = CheckSupported(model); !status.ok()) return status;
  if (!tables.has_vocab) return BpeFieldError("vocab", "missing or not an object");
  if (model.contains("merges") && !model["merges"].is_array()) {
    return BpeFieldError("merges", "not an array");
  }
  BpeModel bpe;
  bpe.vocab_.reserve(tables.vocab.size());
  bpe.tokens_.reserve(tables.vocab.size());
  for (const auto& [token, id] : tables.vocab) {
    if (id < 0 || id >= std::numeric_limits<int32_t>::max()) {
      return BpeFieldError("vocab", absl::StrCat("token ", token, " has id ", id));
    }
    const auto index = static_cast<int32_t>(id);
    if (static_cast<size_t>(index) >= bpe.tokens_.size()) bpe.tokens_.resize(index + 1);
    bpe.tokens_[index] = token;
    bpe.vocab_[token] = index;
  }
  bpe.merges_.reserve(tables.merges.size());
  for (size_t rank = 0; rank < tables.merges.size(); ++rank) {
    const auto& [left_token, right_token] = tables.merges[rank];
    const auto left = bpe.vocab_.find(left_token);
    const auto right = bpe.vocab_.find(right_token);
    const auto merged = bpe.vocab_.find(absl::StrCat(left_token, right_token));
    if (left == bpe.vocab_.end() || right == bpe.vocab_.end() || merged == bpe.vocab_.end()) {
      return BpeFieldError("merges",
                           absl::StrCat("merge ", rank, " (", left_token, " ", right_token,
                                        ") names a token outside the vocabulary"));
    }
    // The first occurrence of a pair is its rank, as in the tokenizers crate.
    bpe.merges_.try_emplace(PairKey(left->second, right->second),
                            Merge{static_cast<int32_t>(rank), merged->second});
  }
  bpe.ignore_merges_ = model.value("ignore_merges", false);
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const auto unk = bpe.vocab_.find(model["unk_token"].get<std::string>());
    if (unk == bpe.vocab_.end()) return BpeFieldError("unk_token", "not in the vocabulary");
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
