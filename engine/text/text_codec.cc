#include "engine/text/text_codec.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/json_file.h"
#include "engine/text/hf_tokenizer.h"
#include "engine/tokenizer.h"

namespace tandem::engine::text {
namespace {

// The embedded model's character tokenizer (engine/tokenizer.h).
class CharacterCodec final : public TextCodec {
 public:
  absl::StatusOr<std::vector<int>> EncodePrompt(absl::string_view text) const override {
    return PromptTokens(text);
  }

  std::string Decode(const std::vector<int>& ids) const override {
    return engine::Decode(ids, SpecialTokens::kSkip);
  }

  std::string DecodeCompletion(const std::vector<int>& ids) const override {
    return engine::Decode(ids, SpecialTokens::kRender);
  }

  const std::vector<int>& StopTokenIds() const override { return stop_ids_; }

  absl::StatusOr<std::string> RenderChat(const std::vector<ChatMessage>&) const override {
    return absl::FailedPreconditionError(
        "chat messages need a Hugging Face model with a ChatML tokenizer; the embedded model "
        "reads plain prompts");
  }

 private:
  const std::vector<int> stop_ids_ = {kEosId};
};

// A Hugging Face model directory's tokenizer.json (optional) and generation settings.
class HfCodec final : public TextCodec {
 public:
  HfCodec(std::string directory, std::optional<HfTokenizer> tokenizer, std::vector<int> stop_ids)
      : directory_(std::move(directory)),
        tokenizer_(std::move(tokenizer)),
        stop_ids_(std::move(stop_ids)) {}

  absl::StatusOr<std::vector<int>> EncodePrompt(absl::string_view text) const override {
    if (!tokenizer_) return NoTokenizer();
    auto ids = tokenizer_->Encode(text);
    if (!ids.ok()) return ids.status();
    const std::vector<int32_t> framed = tokenizer_->Framed(*std::move(ids));
    return std::vector<int>(framed.begin(), framed.end());
  }

  std::string Decode(const std::vector<int>& ids) const override {
    if (!tokenizer_) return "";
    std::vector<int32_t> known;
    for (int id : ids) {
      if (!tokenizer_->TokenBytes(id).empty()) known.push_back(id);
    }
    return *tokenizer_->Decode(known, /*skip_special_tokens=*/true);
  }

  const std::vector<int>& StopTokenIds() const override { return stop_ids_; }

  absl::StatusOr<std::string> RenderChat(const std::vector<ChatMessage>& messages) const override {
    if (!tokenizer_) return NoTokenizer();
    if (tokenizer_->AddedTokenId("<|im_start|>") < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("chat messages need a ChatML (Qwen) chat format; the tokenizer of '",
                       directory_, "' has no <|im_start|> token"));
    }
    return RenderQwen3Chat(messages, ChatOptions{});
  }

 private:
  absl::Status NoTokenizer() const {
    return absl::FailedPreconditionError(
        absl::StrCat("'", directory_, "' has no tokenizer.json: send prompts as token ids"));
  }

  std::string directory_;
  std::optional<HfTokenizer> tokenizer_;
  std::vector<int> stop_ids_;
};

// eos_token_id of generation_config.json, else of config.json: an id, a list of ids or absent.
absl::StatusOr<std::vector<int>> EosTokenIds(const std::filesystem::path& directory) {
  for (const char* file : {"generation_config.json", "config.json"}) {
    const std::filesystem::path path = directory / file;
    if (!std::filesystem::exists(path)) continue;
    auto json = ReadJsonObject(path.string());
    if (!json.ok()) return json.status();
    if (!json->contains("eos_token_id") || (*json)["eos_token_id"].is_null()) continue;
    const nlohmann::json& eos = (*json)["eos_token_id"];
    std::vector<int> ids;
    for (const nlohmann::json& id : eos.is_array() ? eos : nlohmann::json::array({eos})) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
        return absl::InvalidArgumentError(
            absl::StrCat(path.string(), ": eos_token_id ", eos.dump(), " is not a token id"));
      }
      ids.push_back(id.get<int>());
    }
    return ids;
  }
  return std::vector<int>{};
}

absl::StatusOr<std::unique_ptr<TextCodec>> HfCodecFor(const std::filesystem::path& directory) {
  auto stop_ids = EosTokenIds(directory);
  if (!stop_ids.ok()) return stop_ids.status();
  std::optional<HfTokenizer> tokenizer;
  const std::filesystem::path tokenizer_path = directory / "tokenizer.json";
  if (std::filesystem::exists(tokenizer_path)) {
    auto loaded = HfTokenizer::FromFile(tokenizer_path.string());
    if (!loaded.ok()) {
      return absl::Status(loaded.status().code(),
                          absl::StrCat(tokenizer_path.string(), ": ", loaded.status().message()));
    }
    tokenizer.emplace(*std::move(loaded));
    const int32_t turn_end = tokenizer->AddedTokenId("<|im_end|>");
    if (turn_end >= 0 &&
        std::find(stop_ids->begin(), stop_ids->end(), turn_end) == stop_ids->end()) {
      stop_ids->push_back(turn_end);
    }
  }
  return std::make_unique<HfCodec>(directory.string(), std::move(tokenizer), *std::move(stop_ids));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TextCodec>> TextCodecFor(const std::string& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) return HfCodecFor(path);
  return std::make_unique<CharacterCodec>();
}

}  // namespace tandem::engine::text
