#include "engine/text/tokenizer_json_reader.h"

#include <string>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::engine::text {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

TEST(TokenizerJsonReaderTest, TablesLeaveTheDocumentAndEverythingElseStays) {
  auto read = ReadTokenizerJson(R"({
    "vocab": {"kept": 1},
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b", ["ab", "b"]],
              "unk_token": null, "dropout": 0.5, "nested": {"vocab": [1], "merges": {}}},
    "decoder": {"type": "ByteLevel", "list": [true, -3, 18446744073709551615, {"x": []}]}})");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->tables.has_vocab);
  EXPECT_THAT(read->tables.vocab, ElementsAre(Pair("a", 0), Pair("b", 1), Pair("ab", 2)));
  EXPECT_THAT(read->tables.merges, ElementsAre(Pair("a", "b"), Pair("ab", "b")));
  EXPECT_EQ(read->root, nlohmann::json::parse(R"({
    "vocab": {"kept": 1},
    "model": {"type": "BPE", "unk_token": null, "dropout": 0.5,
              "nested": {"vocab": [1], "merges": {}}},
    "decoder": {"type": "ByteLevel", "list": [true, -3, 18446744073709551615, {"x": []}]}})"));
}

TEST(TokenizerJsonReaderTest, TablesOfTheWrongKindStayInTheDocument) {
  auto read = ReadTokenizerJson(R"({"model": {"vocab": ["a"], "merges": {"a": "b"}}})");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_FALSE(read->tables.has_vocab);
  EXPECT_EQ(read->root,
            nlohmann::json::parse(R"({"model": {"vocab": ["a"], "merges": {"a": "b"}}})"));
}

TEST(TokenizerJsonReaderTest, MalformedEntriesAreRefusedNamingTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"model": {"vocab": {"a": "zero"}}})", "model.vocab: token a has id a string"},
      {R"({"model": {"vocab": {"a": 1.5}}})", "model.vocab: token a has id 1.5"},
      {R"({"model": {"vocab": {"a": {}}}})", "model.vocab: token a has id an object"},
      {R"({"model": {"vocab": {}, "merges": ["ab"]}})", "merge 0 is not a pair"},
      {R"({"model": {"vocab": {}, "merges": ["a b", ["a", 1]]}})", "merge 1 is not a pair"},
      {R"({"model": {"vocab": {}, "merges": [["a", "b", "c"]]}})", "merge 0 is not a pair"},
      {R"({"model": {"vocab": {}, "merges": [["a"]]}})", "merge 0 is not a pair"},
      {R"({"model": {"vocab": {}, "merges": [{}]}})", "merge 0 is not a pair"},
      {R"({"model": {"vocab": {"a": 1})", "tokenizer.json: [json.exception.parse_error"},
  };
  for (const auto& [json, message] : cases) {
    auto read = ReadTokenizerJson(json);
    EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument) << json;
    EXPECT_THAT(read.status().message(), HasSubstr(message)) << json;
  }
}

}  // namespace
}  // namespace tandem::engine::text
