#include "engine/text/tokenizer_json_reader.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem::engine::text {
namespace {

using Json = nlohmann::json;

// nlohmann's SAX events: model.vocab's entries and model.merges' pairs go into BpeTables, every
// other value into a document built here (a stack of the open containers).
class Reader {
 public:
  explicit Reader(TokenizerJson& out) : out_(out) {}

  bool null() { return Scalar(Json(nullptr), "null"); }
  bool boolean(bool value) { return Scalar(Json(value), value ? "true" : "false"); }
  bool number_integer(Json::number_integer_t value) {
    if (section_ == Section::kVocab) return VocabEntry(value);
    return Scalar(Json(value), absl::StrCat(value));
  }
  bool number_unsigned(Json::number_unsigned_t value) {
    if (section_ == Section::kVocab) {
      return VocabEntry(static_cast<int64_t>(
          std::min<Json::number_unsigned_t>(value, std::numeric_limits<int64_t>::max())));
    }
    return Scalar(Json(value), absl::StrCat(value));
  }
  bool number_float(Json::number_float_t value, const std::string& text) {
    return Scalar(Json(value), text);
  }
  bool string(std::string& value) {
    switch (section_) {
      case Section::kMerges:
        if (auto parts = SplitMerge(value); parts.has_value()) {
          out_.tables.merges.push_back(*std::move(parts));
          return true;
        }
        return NotAPair();
      case Section::kMergePair:
        pair_.push_back(std::move(value));
        return pair_.size() <= 2 || NotAPair();
      default:
        return Scalar(Json(std::move(value)), "a string");
    }
  }
  bool binary(Json::binary_t& /*value*/) { return Scalar(Json(), "binary"); }

  bool start_object(std::size_t /*elements*/) {
    if (section_ != Section::kDocument) return Scalar(Json(), "an object");
    if (std::exchange(next_, Section::kDocument) == Section::kVocab) {
      out_.tables.has_vocab = true;
      section_ = Section::kVocab;
      return true;
    }
    Json* object = Add(Json::object());
    if (open_.size() == 1 && key_ == "model") model_ = object;
    open_.push_back(object);
    return true;
  }
  bool key(std::string& name) {
    if (section_ == Section::kVocab) {
      token_ = std::move(name);
      return true;
    }
    key_ = std::move(name);
    next_ = Section::kDocument;
    if (!open_.empty() && open_.back() == model_) {
      if (key_ == "vocab") next_ = Section::kVocab;
      if (key_ == "merges") next_ = Section::kMerges;
    }
    return true;
  }
  bool end_object() {
    if (section_ == Section::kVocab) {
      section_ = Section::kDocument;
    } else {
      open_.pop_back();
    }
    return true;
  }
  bool start_array(std::size_t /*elements*/) {
    switch (section_) {
      case Section::kMerges:
        section_ = Section::kMergePair;
        pair_.clear();
        return true;
      case Section::kDocument:
        if (std::exchange(next_, Section::kDocument) == Section::kMerges) {
          section_ = Section::kMerges;
          return true;
        }
        open_.push_back(Add(Json::array()));
        return true;
      default:
        return Scalar(Json(), "an array");
    }
  }
  bool end_array() {
    switch (section_) {
      case Section::kMergePair:
        if (pair_.size() != 2) return NotAPair();
        out_.tables.merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
        section_ = Section::kMerges;
        return true;
      case Section::kMerges:
        section_ = Section::kDocument;
        return true;
      default:
        open_.pop_back();
        return true;
    }
  }
  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/,
                   const Json::exception& error) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", error.what())));
  }

  absl::Status status() const { return status_; }

 private:
  enum class Section { kDocument, kVocab, kMerges, kMergePair };

  // A scalar (or, outside the document, any value): `text` names it in errors.
  bool Scalar(Json value, absl::string_view text) {
    switch (section_) {
      case Section::kDocument:
        next_ = Section::kDocument;
        Add(std::move(value));
        return true;
      case Section::kVocab:
        return Fail(BpeFieldError("vocab", absl::StrCat("token ", token_, " has id ", text)));
      default:
        return NotAPair();
    }
  }
  bool VocabEntry(int64_t id) {
    out_.tables.vocab.emplace_back(std::move(token_), id);
    return true;
  }
  bool NotAPair() {
    return Fail(BpeFieldError(
        "merges", absl::StrCat("merge ", out_.tables.merges.size(), " is not a pair of strings")));
  }
  bool Fail(absl::Status status) {
    status_ = std::move(status);
    return false;  // Stops the parse.
  }
  // Places `value` where the document expects the next one; returns where it went, which stays
  // put while it is the innermost open container (elements are added only to that one).
  Json* Add(Json value) {
    if (open_.empty()) {
      out_.root = std::move(value);
      return &out_.root;
    }
    Json& parent = *open_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(value));
      return &parent.back();
    }
    Json& slot = parent[key_];
    slot = std::move(value);
    return &slot;
  }

  TokenizerJson& out_;
  absl::Status status_;
  std::vector<Json*> open_;  // The document's open containers, outermost first.
  const Json* model_ = nullptr;
  std::string key_;    // The document's last key.
  std::string token_;  // The vocabulary's last key.
  Section section_ = Section::kDocument;
  Section next_ = Section::kDocument;  // What the value after key_ starts.
  std::vector<std::string> pair_;
};

}  // namespace

absl::StatusOr<TokenizerJson> ReadTokenizerJson(absl::string_view json) {
  TokenizerJson out;
  Reader reader(out);
  if (!Json::sax_parse(json.begin(), json.end(), &reader) && reader.status().ok()) {
    return absl::InvalidArgumentError("tokenizer.json: not valid JSON");
  }
  if (!reader.status().ok()) return reader.status();
  return out;
}

}  // namespace tandem::engine::text
