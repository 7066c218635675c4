#include "engine/text/hf_tokenizer.h"

#include <string>
#include <vector>

#include "engine/text/byte_level.h"
#include "engine/text/utf8_stream.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::engine::text {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A byte-level tokenizer: the 256 byte characters (id = byte), "Ġw" and "Ġwo" merged, and
// two added tokens. The pre-tokenizer splits words with their leading space, as GPT-2's does.
nlohmann::json TinyTokenizer() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int byte = 0; byte < 256; ++byte)
    vocab[ToByteLevel(std::string(1, static_cast<char>(byte)))] = byte;
  vocab[ToByteLevel(" w")] = 256;
  vocab[ToByteLevel(" wo")] = 257;
  return {
      {"added_tokens",
       {{{"id", 300}, {"content", "<|end|>"}, {"special", true}},
        {{"id", 301}, {"content", "<|end|>!"}, {"special", false}}}},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", R"( ?\p{L}+|\s+|[^\s\p{L}]+)"}}},
           {"behavior", "Isolated"}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", nlohmann::json::array({nlohmann::json::array({ToByteLevel(" "), "w"}),
                                          nlohmann::json::array({ToByteLevel(" w"), "o"})})}}},
      {"decoder", {{"type", "ByteLevel"}}},
  };
}

HfTokenizer Tiny() {
  auto tokenizer = HfTokenizer::FromJson(TinyTokenizer().dump());
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return *std::move(tokenizer);
}

TEST(HfTokenizerTest, EncodesWordsThroughByteLevelBpe) {
  auto ids = Tiny().Encode("a wo");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, ElementsAre('a', 257));
}

TEST(HfTokenizerTest, AddedTokensInTheTextAreTheirOwnIdsLongestFirst) {
  auto ids = Tiny().Encode("x<|end|>y<|end|>!");
  ASSERT_TRUE(ids.ok());
  EXPECT_THAT(*ids, ElementsAre('x', 300, 'y', 301));
}

TEST(HfTokenizerTest, NormalizesToNfcBeforeSplitting) {
  auto decomposed = Tiny().Encode("e\xCC\x81");  // e + COMBINING ACUTE
  auto composed = Tiny().Encode("\xC3\xA9");     // é
  ASSERT_TRUE(decomposed.ok() && composed.ok());
  EXPECT_EQ(*decomposed, *composed);
  EXPECT_THAT(*composed, ElementsAre(0xC3, 0xA9));
}

TEST(HfTokenizerTest, DecodeRoundTripsAndSkipsSpecialTokensOnRequest) {
  const HfTokenizer tokenizer = Tiny();
  const std::string text = "Hi wo 你好 😀<|end|> ok";
  auto ids = tokenizer.Encode(text);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(tokenizer.Decode(*ids).value(), text);
  EXPECT_EQ(tokenizer.Decode(*ids, /*skip_special_tokens=*/true).value(), "Hi wo 你好 😀 ok");
}

TEST(HfTokenizerTest, StreamingTheTokensBytesNeverShowsABrokenCharacter) {
  const HfTokenizer tokenizer = Tiny();
  auto ids = tokenizer.Encode("中😀");  // Seven single-byte tokens.
  ASSERT_TRUE(ids.ok());
  ASSERT_EQ(ids->size(), 7);
  Utf8Stream stream;
  std::vector<std::string> shown;
  for (int32_t id : *ids) shown.push_back(stream.Append(tokenizer.TokenBytes(id)));
  EXPECT_THAT(shown, ElementsAre("", "", "中", "", "", "", "😀"));
}

TEST(HfTokenizerTest, AnIdOutsideTheVocabularyIsOutOfRange) {
  auto text = Tiny().Decode({'a', 299});
  EXPECT_EQ(text.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(text.status().message(), HasSubstr("299"));
  EXPECT_EQ(Tiny().vocab_size(), 302);
  EXPECT_EQ(Tiny().AddedTokenId("<|end|>"), 300);
}

TEST(HfTokenizerTest, ComponentsItDoesNotImplementAreRefusedByName) {
  const std::vector<std::pair<std::string, nlohmann::json>> unsupported = {
      {"normalizer", {{"type", "NFKC"}}},
      {"pre_tokenizer", {{"type", "Metaspace"}}},
      {"pre_tokenizer",
       {{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "MergedWithPrevious"}}},
      {"decoder", {{"type", "WordPiece"}}},
      {"added_tokens", {{{"id", 5}, {"content", "x"}, {"single_word", true}}}},
  };
  for (const auto& [field, value] : unsupported) {
    nlohmann::json json = TinyTokenizer();
    json[field] = value;
    auto tokenizer = HfTokenizer::FromJson(json.dump());
    ASSERT_FALSE(tokenizer.ok()) << value;
    EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(tokenizer.status().message(), HasSubstr(field)) << value;
  }
  EXPECT_FALSE(HfTokenizer::FromJson("not json").ok());
  for (const char* hostile :
       {R"({"model": {"vocab": [], "merges": {}}})", R"({"model": {"vocab": {"a": "zero"}}})",
        R"({"model": {"vocab": {}, "merges": [["a", 1]]}})",
        R"({"model": {"vocab": {}}, "added_tokens": [{"single_word": "yes"}]})",
        R"({"model": {"vocab": {}}, "pre_tokenizer": {"type": "Split",
                                  "behavior": "Isolated", "pattern": {"Regex": 7}}})",
        R"({"model": 3})"}) {
    EXPECT_EQ(HfTokenizer::FromJson(hostile).status().code(), absl::StatusCode::kInvalidArgument)
        << hostile;
  }
  EXPECT_EQ(HfTokenizer::FromFile("/nonexistent/tokenizer.json").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tandem::engine::text
