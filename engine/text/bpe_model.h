#ifndef TANDEM_ENGINE_TEXT_BPE_MODEL_H_
#define TANDEM_ENGINE_TEXT_BPE_MODEL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"

namespace tandem::engine::text {

// A BPE model's vocabulary and merges as tokenizer.json lists them, not yet checked.
struct BpeTables {
  bool has_vocab = false;                                   // model.vocab is an object.
  std::vector<std::pair<std::string, int64_t>> vocab;       // (token, id).
  std::vector<std::pair<std::string, std::string>> merges;  // By rank.
};

// INVALID_ARGUMENT "tokenizer.json model.<field>: <why>".
absl::Status BpeFieldError(absl::string_view field, absl::string_view why);
// A merge in the older form "a b"; nullopt unless it has two parts.
std::optional<std::pair<std::string, std::string>> SplitMerge(absl::string_view merge);

// The BPE model of a Hugging Face tokenizer.json: a vocabulary and ranked merges. A word (one
// pre-tokenized piece, spelled in the vocabulary's alphabet) starts as its characters and the
// adjacent pair of lowest rank is merged until no pair has a merge, as the tokenizers crate
// does. Thread-safe; words seen before are answered from a bounded cache.
class BpeModel {
 public:
  // From tokenizer.json's "model" object. INVALID_ARGUMENT naming the field for what this
  // model does not implement (dropout, byte_fallback, subword prefixes and suffixes) and for a
  // merge whose parts or result are not in the vocabulary.
  static absl::StatusOr<BpeModel> FromJson(const nlohmann::json& model);
  // The same from the model object's other fields and its tables read apart (as
  // ReadTokenizerJson does); model.vocab and model.merges, if present, are not read.
  static absl::StatusOr<BpeModel> FromJson(const nlohmann::json& model, const BpeTables& tables);

  BpeModel(BpeModel&& other) noexcept;

  // Appends the ids of `word`. A character outside the vocabulary becomes unk_token, or
  // INVALID_ARGUMENT naming it when the model has none.
  absl::Status AppendIds(absl::string_view word, std::vector<int32_t>& ids) const;

  // The vocabulary entry of `id`; nullptr outside the vocabulary.
  const std::string* Token(int32_t id) const;
  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }

 private:
  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  BpeModel() = default;
  static absl::StatusOr<BpeModel> Build(const nlohmann::json& model, const BpeTables& tables);
  absl::Status Tokenize(absl::string_view word, std::vector<int32_t>& ids) const;

  absl::flat_hash_map<std::string, int32_t> vocab_;
  std::vector<std::string> tokens_;              // By id; empty where the vocabulary has a gap.
  absl::flat_hash_map<uint64_t, Merge> merges_;  // Keyed by (left id << 32 | right id).
  bool ignore_merges_ = false;                   // Llama-3: a word in the vocabulary is one token.
  int32_t unk_id_ = -1;

  mutable absl::Mutex cache_mutex_;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache_
      ABSL_GUARDED_BY(cache_mutex_);
};

}  // namespace tandem::engine::text

#endif  // TANDEM_ENGINE_TEXT_BPE_MODEL_H_
