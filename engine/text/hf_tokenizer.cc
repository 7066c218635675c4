#include "engine/text/hf_tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/text/byte_level.h"
#include "engine/text/tokenizer_json_reader.h"
#include "engine/text/utf8_stream.h"

namespace tandem::engine::text {
namespace {

// The pattern of the ByteLevel pre-tokenizer with use_regex (GPT-2's).
constexpr absl::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

absl::Status Unsupported(absl::string_view field, const nlohmann::json& value) {
  return absl::InvalidArgumentError(
      absl::StrCat("tokenizer.json ", field, " = ", value.dump(), " is not supported"));
}

// The members of a "Sequence" component, or the component itself.
std::vector<nlohmann::json> Flattened(const nlohmann::json& component, const char* members) {
  if (component.value("type", "") != "Sequence") return {component};
  std::vector<nlohmann::json> flat;
  for (const auto& member : component.value(members, nlohmann::json::array())) {
    for (auto& inner : Flattened(member, members)) flat.push_back(std::move(inner));
  }
  return flat;
}

// Whether `component` (null, one component or a Sequence of them) holds a component of
// `type`; INVALID_ARGUMENT naming `field` when it holds any other.
absl::StatusOr<bool> HasOnly(const nlohmann::json& component, const char* members,
                             absl::string_view type, absl::string_view field) {
  if (component.is_null()) return false;
  bool found = false;
  for (const auto& step : Flattened(component, members)) {
    if (step.value("type", "") != type) return Unsupported(field, step);
    found = true;
  }
  return found;
}

absl::StatusOr<std::string> Nfc(absl::string_view text) {
  if (std::all_of(text.begin(), text.end(), [](char c) { return (c & 0x80) == 0; })) {
    return std::string(text);  // ASCII is already NFC.
  }
  utf8proc_uint8_t* normalized = nullptr;
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &normalized,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (length < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("text is not valid UTF-8: ", utf8proc_errmsg(length)));
  }
  std::string out(reinterpret_cast<const char*>(normalized), static_cast<size_t>(length));
  std::free(normalized);
  return out;
}

bool IsAsciiSpace(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

}  // namespace

absl::StatusOr<HfTokenizer> HfTokenizer::FromFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot open tokenizer file ", path));
  file.seekg(0, std::ios::end);
  std::string contents(static_cast<size_t>(file.tellg()), '\0');
  file.seekg(0);
  file.read(contents.data(), static_cast<std::streamsize>(contents.size()));
  if (!file) return absl::DataLossError(absl::StrCat("cannot read tokenizer file ", path));
  auto tokenizer = FromJson(contents);
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(),
                        absl::StrCat(path, ": ", tokenizer.status().message()));
  }
  return tokenizer;
}

absl::StatusOr<HfTokenizer> HfTokenizer::FromJson(absl::string_view json) {
  absl::StatusOr<TokenizerJson> read = ReadTokenizerJson(json);
  if (!read.ok()) return read.status();
  try {
    return Parse(read->root, read->tables);
  } catch (const nlohmann::json::exception& error) {  // A field of the wrong JSON type.
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", error.what()));
  }
}

absl::StatusOr<HfTokenizer> HfTokenizer::Parse(const nlohmann::json& root,
                                               const BpeTables& tables) {
  if (!root.is_object()) return absl::InvalidArgumentError("tokenizer.json is not a JSON object");
  if (!root.contains("model")) return absl::InvalidArgumentError("tokenizer.json has no model");
  auto model = BpeModel::FromJson(root["model"], tables);
  if (!model.ok()) return model.status();
  HfTokenizer tokenizer(*std::move(model));
  const nlohmann::json null;
  auto field = [&](const char* name) -> const nlohmann::json& {
    return root.contains(name) ? root[name] : null;
  };
  for (absl::Status status : {tokenizer.ParseAddedTokens(field("added_tokens")),
                              tokenizer.ParseNormalizer(field("normalizer")),
                              tokenizer.ParsePreTokenizer(field("pre_tokenizer")),
                              tokenizer.ParseDecoder(field("decoder")),
                              tokenizer.ParsePostProcessor(field("post_processor"))}) {
    if (!status.ok()) return status;
  }
  return tokenizer;
}

absl::Status HfTokenizer::ParseAddedTokens(const nlohmann::json& tokens) {
  if (tokens.is_null()) return absl::OkStatus();
  for (const auto& token : tokens) {
    if (token.value("single_word", false)) return Unsupported("added_tokens[].single_word", true);
    const std::string content = token.value("content", "");
    if (content.empty() || !token.contains("id") || !token["id"].is_number_integer()) {
      return Unsupported("added_tokens[]", token);
    }
    added_by_id_[token["id"].get<int32_t>()] = added_tokens_.size();
    added_tokens_.push_back({token["id"].get<int32_t>(), content, token.value("special", false),
                             token.value("lstrip", false), token.value("rstrip", false)});
  }
  for (size_t i = 0; i < added_tokens_.size(); ++i) {
    added_by_first_byte_[static_cast<unsigned char>(added_tokens_[i].content[0])].push_back(i);
  }
  for (auto& candidates : added_by_first_byte_) {
    std::stable_sort(candidates.begin(), candidates.end(), [&](size_t a, size_t b) {
      return added_tokens_[a].content.size() > added_tokens_[b].content.size();
    });
  }
  return absl::OkStatus();
}

absl::Status HfTokenizer::ParseNormalizer(const nlohmann::json& normalizer) {
  auto nfc = HasOnly(normalizer, "normalizers", "NFC", "normalizer");
  if (!nfc.ok()) return nfc.status();
  nfc_ = *nfc;
  return absl::OkStatus();
}

absl::Status HfTokenizer::ParsePreTokenizer(const nlohmann::json& pre_tokenizer) {
  if (pre_tokenizer.is_null()) return absl::OkStatus();
  for (const auto& step : Flattened(pre_tokenizer, "pretokenizers")) {
    const std::string type = step.value("type", "");
    if (type == "ByteLevel") {
      std::optional<RegexSplit> gpt2_split;
      if (step.value("use_regex", true)) gpt2_split = *RegexSplit::Compile(kGpt2Pattern);
      pre_tokenizer_.emplace_back(
          ByteLevelStep{step.value("add_prefix_space", false), std::move(gpt2_split)});
      byte_level_ = true;
      continue;
    }
    if (type != "Split" || byte_level_) return Unsupported("pre_tokenizer", step);
    if (step.value("behavior", "") != "Isolated" || step.value("invert", false)) {
      return Unsupported("pre_tokenizer Split behavior/invert", step);
    }
    const nlohmann::json& pattern = step.value("pattern", nlohmann::json::object());
    std::string regex;
    if (pattern.contains("Regex")) {
      regex = pattern["Regex"].get<std::string>();
    } else if (pattern.contains("String")) {
      regex = absl::StrCat("\\Q", pattern["String"].get<std::string>(), "\\E");
    } else {
      return Unsupported("pre_tokenizer Split pattern", pattern);
    }
    auto split = RegexSplit::Compile(regex);
    if (!split.ok()) return split.status();
    pre_tokenizer_.emplace_back(*std::move(split));
  }
  return absl::OkStatus();
}

absl::Status HfTokenizer::ParseDecoder(const nlohmann::json& decoder) {
  auto byte_level = HasOnly(decoder, "decoders", "ByteLevel", "decoder");
  if (!byte_level.ok()) return byte_level.status();
  byte_level_decoder_ = *byte_level;
  return absl::OkStatus();
}

// ByteLevel post-processing only touches offsets; TemplateProcessing frames a single sequence
// with special tokens ("single": [{"SpecialToken": {"id": NAME}}, {"Sequence": {"id": "A"}}]).
absl::Status HfTokenizer::ParsePostProcessor(const nlohmann::json& processor) {
  if (processor.is_null()) return absl::OkStatus();
  for (const auto& step : Flattened(processor, "processors")) {
    const std::string type = step.value("type", "");
    if (type == "ByteLevel") continue;
    if (type != "TemplateProcessing") return Unsupported("post_processor", step);
    bool before_sequence = true;
    for (const auto& piece : step.value("single", nlohmann::json::array())) {
      if (piece.contains("Sequence")) {
        before_sequence = false;
        continue;
      }
      const std::string name =
          piece.contains("SpecialToken") ? piece["SpecialToken"].value("id", "") : "";
      const nlohmann::json& special = step.value("special_tokens", nlohmann::json::object());
      if (name.empty() || !special.contains(name) || !special[name].contains("ids")) {
        return Unsupported("post_processor.single", piece);
      }
      std::vector<int32_t>& frame = before_sequence ? frame_before_ : frame_after_;
      for (const auto& id : special[name]["ids"]) frame.push_back(id.get<int32_t>());
    }
  }
  return absl::OkStatus();
}

std::vector<int32_t> HfTokenizer::Framed(std::vector<int32_t> ids) const {
  ids.insert(ids.begin(), frame_before_.begin(), frame_before_.end());
  ids.insert(ids.end(), frame_after_.begin(), frame_after_.end());
  return ids;
}

const HfTokenizer::AddedToken* HfTokenizer::AddedTokenAt(absl::string_view text,
                                                         size_t position) const {
  for (size_t index : added_by_first_byte_[static_cast<unsigned char>(text[position])]) {
    if (absl::StartsWith(text.substr(position), added_tokens_[index].content)) {
      return &added_tokens_[index];
    }
  }
  return nullptr;
}

std::vector<HfTokenizer::Segment> HfTokenizer::SplitOnAddedTokens(absl::string_view text) const {
  std::vector<Segment> segments;
  size_t plain_begin = 0;
  for (size_t i = 0; i < text.size();) {
    const AddedToken* added = AddedTokenAt(text, i);
    if (added == nullptr) {
      ++i;
      continue;
    }
    size_t plain_end = i;  // lstrip: the token swallows the whitespace before it.
    while (added->lstrip && plain_end > plain_begin && IsAsciiSpace(text[plain_end - 1])) {
      --plain_end;
    }
    if (plain_end > plain_begin) {
      segments.push_back({text.substr(plain_begin, plain_end - plain_begin), nullptr});
    }
    segments.push_back({text.substr(i, added->content.size()), added});
    i += added->content.size();
    while (added->rstrip && i < text.size() && IsAsciiSpace(text[i])) ++i;
    plain_begin = i;
  }
  if (plain_begin < text.size()) segments.push_back({text.substr(plain_begin), nullptr});
  return segments;
}

absl::Status HfTokenizer::EncodePlain(absl::string_view text, std::vector<int32_t>& ids) const {
  std::string normalized(text);
  if (nfc_) {
    auto composed = Nfc(text);
    if (!composed.ok()) return composed.status();
    normalized = *std::move(composed);
  }
  std::vector<std::string> pieces = {normalized};
  for (const PreTokenizerStep& step : pre_tokenizer_) {
    std::vector<std::string> next;
    if (const auto* split = std::get_if<RegexSplit>(&step)) {
      for (const std::string& piece : pieces) {
        for (absl::string_view part : split->Split(piece)) next.emplace_back(part);
      }
    } else {
      const auto& byte_level = std::get<ByteLevelStep>(step);
      for (std::string& piece : pieces) {
        if (byte_level.add_prefix_space && !piece.starts_with(' ')) piece.insert(0, " ");
        if (!byte_level.gpt2_split) {
          next.push_back(std::move(piece));
          continue;
        }
        for (absl::string_view part : byte_level.gpt2_split->Split(piece)) next.emplace_back(part);
      }
    }
    pieces = std::move(next);
  }
  for (const std::string& piece : pieces) {
    absl::Status status = model_.AppendIds(byte_level_ ? ToByteLevel(piece) : piece, ids);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> HfTokenizer::Encode(absl::string_view text) const {
  std::vector<int32_t> ids;
  for (const Segment& segment : SplitOnAddedTokens(text)) {
    if (segment.added != nullptr) {
      ids.push_back(segment.added->id);
    } else if (absl::Status status = EncodePlain(segment.text, ids); !status.ok()) {
      return status;
    }
  }
  return ids;
}

std::string HfTokenizer::TokenBytes(int32_t id) const {
  if (const auto added = added_by_id_.find(id); added != added_by_id_.end()) {
    return added_tokens_[added->second].content;
  }
  const std::string* token = model_.Token(id);
  if (token == nullptr) return "";
  if (!byte_level_decoder_) return *token;
  return FromByteLevel(*token).value_or(*token);
}

absl::StatusOr<std::string> HfTokenizer::Decode(const std::vector<int32_t>& ids,
                                                bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t id : ids) {
    const auto added = added_by_id_.find(id);
    if (added == added_by_id_.end() && model_.Token(id) == nullptr) {
      return absl::OutOfRangeError(
          absl::StrCat("token id ", id, " is not in the vocabulary (", vocab_size(), " ids)"));
    }
    if (added != added_by_id_.end() && skip_special_tokens &&
        added_tokens_[added->second].special) {
      continue;
    }
    bytes += TokenBytes(id);
  }
  return LossyUtf8(bytes);
}

int32_t HfTokenizer::AddedTokenId(absl::string_view content) const {
  for (const AddedToken& token : added_tokens_) {
    if (token.content == content) return token.id;
  }
  return -1;
}

int32_t HfTokenizer::vocab_size() const {
  int32_t size = model_.vocab_size();
  for (const AddedToken& token : added_tokens_) size = std::max(size, token.id + 1);
  return size;
}

}  // namespace tandem::engine::text
