#ifndef TANDEM_ENGINE_TEXT_TOKENIZER_JSON_READER_H_
#define TANDEM_ENGINE_TEXT_TOKENIZER_JSON_READER_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/text/bpe_model.h"
#include "nlohmann/json.hpp"

namespace tandem::engine::text {

// A tokenizer.json read in one pass: the BPE model's vocabulary and merges (about 150k entries
// each in Qwen3's) straight into their tables, everything else into a JSON document.
struct TokenizerJson {
  // The document without model.vocab when it is an object and without model.merges when it is
  // an array: those are in `tables`.
  nlohmann::json root;
  BpeTables tables;
};

// INVALID_ARGUMENT for text that is not JSON, a vocabulary id that is not an integer and a
// merge that is not a pair of strings. Reading the tables without building a document for
// them is what makes this several times faster than nlohmann::json::parse on such files.
absl::StatusOr<TokenizerJson> ReadTokenizerJson(absl::string_view json);

}  // namespace tandem::engine::text

#endif  // TANDEM_ENGINE_TEXT_TOKENIZER_JSON_READER_H_
