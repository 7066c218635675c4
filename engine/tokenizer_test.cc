#include "engine/tokenizer.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(TokenizerTest, VocabularyLayoutIsFixed) {
  EXPECT_EQ(kVocabSize, 49);
  EXPECT_THAT(*Encode("09+ az"), ElementsAre(3, 12, 13, 21, 23, 48));
}

TEST(TokenizerTest, RoundTripsEveryCharacter) {
  const std::string text = kAlphabet;
  const absl::StatusOr<std::vector<int>> ids = Encode(text);
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_EQ(ids->size(), text.size());
  for (size_t i = 0; i < ids->size(); ++i) {
    EXPECT_EQ((*ids)[i], kNumSpecialTokens + static_cast<int>(i));
  }
  EXPECT_EQ(Decode(*ids), text);
}

TEST(TokenizerTest, RoundTripsTaskText) {
  for (const std::string text : {"12+345=357", "r:1234=4321", "s:3141=1134", ""}) {
    const absl::StatusOr<std::vector<int>> ids = Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(Decode(*ids), text);
  }
}

TEST(TokenizerTest, UnknownCharacterNamesCharacterAndPosition) {
  const absl::StatusOr<std::vector<int>> ids = Encode("12+A4=");
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ids.status().message(), HasSubstr("'A' at position 3"));
}

TEST(TokenizerTest, UnknownNonPrintableCharacterIsEscaped) {
  const absl::StatusOr<std::vector<int>> ids = Encode(std::string("1\n", 2));
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ids.status().message(), HasSubstr("'\\n' at position 1"));
}

TEST(TokenizerTest, SpecialTokensSkippedOrRendered) {
  const std::vector<int> ids = {kBosId, 4, 5, kEosId, kPadId};
  EXPECT_EQ(Decode(ids), "12");
  EXPECT_EQ(Decode(ids, SpecialTokens::kRender), "<bos>12<eos><pad>");
}

TEST(TokenizerTest, OutOfRangeIdsDecodeToQuestionMark) {
  EXPECT_EQ(Decode({-1, 3, kVocabSize}), "?0?");
}

TEST(TokenizerTest, PromptTokensStartWithBosAndRejectUnknownCharacters) {
  auto tokens = PromptTokens("1+2=");
  ASSERT_TRUE(tokens.ok());
  EXPECT_EQ(tokens->front(), 1);
  EXPECT_EQ(tokens->size(), 5u);
  EXPECT_FALSE(PromptTokens("1+2=?").ok());
}

}  // namespace
}  // namespace tandem::engine
