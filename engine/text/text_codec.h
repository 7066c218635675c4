#ifndef TANDEM_ENGINE_TEXT_TEXT_CODEC_H_
#define TANDEM_ENGINE_TEXT_TEXT_CODEC_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/text/chat_format.h"

namespace tandem::engine::text {

// The text side of a base model: how prompts become its token ids, which ids end generation,
// and how generated ids read back for a verifier. Trainer and rollout build the same one from
// the same base model path, so a prompt means the same ids on both.
class TextCodec {
 public:
  virtual ~TextCodec() = default;

  // A prompt's ids as the model expects them: the embedded model's <bos> + characters, or a
  // Hugging Face tokenizer's ids of the text (added tokens such as "<|im_start|>" recognised),
  // framed as its post-processor frames one sequence (as tokenizer(text) does: a BOS for
  // DeepSeek-V3, nothing for Qwen3). INVALID_ARGUMENT for text the tokenizer cannot encode;
  // FAILED_PRECONDITION when the model has no tokenizer.
  virtual absl::StatusOr<std::vector<int>> EncodePrompt(absl::string_view text) const = 0;

  // The text of generated ids as a user reads it: special tokens skipped, and ids the
  // tokenizer does not know (a model's vocabulary may be larger) dropped, as transformers'
  // decode does. Empty for a model without a tokenizer.
  virtual std::string Decode(const std::vector<int>& ids) const = 0;

  // A completion's text as a verifier reads it: the embedded model renders "<eos>" (where a
  // completion ends, see Task::Reward); otherwise as Decode.
  virtual std::string DecodeCompletion(const std::vector<int>& ids) const { return Decode(ids); }

  // Ids after which generation stops (the stop id is kept in the output).
  virtual const std::vector<int>& StopTokenIds() const = 0;

  // A conversation as the model's chat template renders it, ending with the assistant's
  // header. FAILED_PRECONDITION for a model without a ChatML (Qwen) chat format.
  virtual absl::StatusOr<std::string> RenderChat(
      const std::vector<ChatMessage>& messages) const = 0;
};

// The codec of the base model at `path` (engine::hf::LoadBaseModel's argument):
// - an engine safetensors file: the character tokenizer, stopping at <eos>;
// - a Hugging Face model directory: its tokenizer.json when present (without one, prompts must
//   come as token ids), stopping at eos_token_id of generation_config.json (else of
//   config.json; an id or a list) and at ChatML's "<|im_end|>" when the tokenizer has it; chat
//   rendered as Qwen3's template does when the tokenizer has "<|im_start|>".
// Errors name the file: a tokenizer.json the tokenizer refuses, a malformed eos_token_id.
absl::StatusOr<std::unique_ptr<TextCodec>> TextCodecFor(const std::string& path);

}  // namespace tandem::engine::text

#endif  // TANDEM_ENGINE_TEXT_TEXT_CODEC_H_
