#ifndef TANDEM_ENGINE_TEXT_HF_TOKENIZER_H_
#define TANDEM_ENGINE_TEXT_HF_TOKENIZER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/text/bpe_model.h"
#include "engine/text/regex_split.h"

namespace tandem::engine::text {

// A byte-level BPE tokenizer read from a Hugging Face tokenizer.json (Qwen2/Qwen3, Llama-3,
// GPT-2 style), encoding as the tokenizers crate does:
//   1. the text is cut at added tokens (leftmost, longest first; e.g. "<|im_start|>"), which
//      become their own ids: special tokens written in the text are recognised;
//   2. each other stretch is normalized (none, or NFC),
//   3. pre-tokenized (Split with a regex, behavior Isolated; ByteLevel, optionally with its
//      own GPT-2 regex and a prefix space),
//   4. and each piece, spelled in the byte-level alphabet, is tokenized by the BPE model.
// Encode adds no framing tokens (the post-processor is not applied, as with
// add_special_tokens=False): callers frame sequences with a chat template or with Framed(),
// which applies the post-processor (ByteLevel: nothing; TemplateProcessing: its special tokens
// around a single sequence).
// Components or options outside this list are refused when loading, naming the field, never
// approximated. Added tokens are matched in the text before normalization.
class HfTokenizer {
 public:
  static absl::StatusOr<HfTokenizer> FromFile(const std::string& path);
  static absl::StatusOr<HfTokenizer> FromJson(absl::string_view json);

  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const;

  // `ids` framed as the post-processor frames a single sequence (add_special_tokens=True):
  // e.g. a BOS before them from a TemplateProcessing; unchanged for ByteLevel or none.
  std::vector<int32_t> Framed(std::vector<int32_t> ids) const;

  // The text of `ids`; bytes that do not form characters become U+FFFD. OUT_OF_RANGE naming
  // an id that is neither in the vocabulary nor an added token.
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids,
                                     bool skip_special_tokens = false) const;

  // The bytes one token stands for, to be joined by a Utf8Stream while generating; empty for
  // an unknown id.
  std::string TokenBytes(int32_t id) const;

  // The id of an added token such as "<|im_end|>"; -1 when there is none.
  int32_t AddedTokenId(absl::string_view content) const;

  // One more than the largest id of the vocabulary and the added tokens.
  int32_t vocab_size() const;

 private:
  struct AddedToken {
    int32_t id;
    std::string content;
    bool special;
    bool lstrip;
    bool rstrip;
  };
  struct ByteLevelStep {
    bool add_prefix_space;
    std::optional<RegexSplit> gpt2_split;  // With use_regex: GPT-2's pattern, compiled once.
  };
  using PreTokenizerStep = std::variant<RegexSplit, ByteLevelStep>;
  struct Segment {
    absl::string_view text;
    const AddedToken* added;  // nullptr: plain text.
  };

  explicit HfTokenizer(BpeModel model) : model_(std::move(model)) {}
  // `root` without the BPE model's tables, which are in `tables` (ReadTokenizerJson).
  static absl::StatusOr<HfTokenizer> Parse(const nlohmann::json& root, const BpeTables& tables);
  absl::Status ParseAddedTokens(const nlohmann::json& tokens);
  absl::Status ParseNormalizer(const nlohmann::json& normalizer);
  absl::Status ParsePreTokenizer(const nlohmann::json& pre_tokenizer);
  absl::Status ParseDecoder(const nlohmann::json& decoder);
  absl::Status ParsePostProcessor(const nlohmann::json& processor);

  std::vector<Segment> SplitOnAddedTokens(absl::string_view text) const;
  const AddedToken* AddedTokenAt(absl::string_view text, size_t position) const;
  absl::Status EncodePlain(absl::string_view text, std::vector<int32_t>& ids) const;

  BpeModel model_;
  std::vector<AddedToken> added_tokens_;
  absl::flat_hash_map<int32_t, size_t> added_by_id_;
  // Indices into added_tokens_ by first byte, longest content first.
  std::vector<std::vector<size_t>> added_by_first_byte_ = std::vector<std::vector<size_t>>(256);
  bool nfc_ = false;
  std::vector<PreTokenizerStep> pre_tokenizer_;
  bool byte_level_ = false;  // Pieces are spelled in the byte-level alphabet before BPE.
  bool byte_level_decoder_ = false;
  std::vector<int32_t> frame_before_, frame_after_;  // From the post-processor's template.
};

}  // namespace tandem::engine::text

#endif  // TANDEM_ENGINE_TEXT_HF_TOKENIZER_H_
