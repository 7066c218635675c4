#include "engine/text/regex_split.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::engine::text {
namespace {

using ::testing::ElementsAre;

std::vector<std::string> Pieces(absl::string_view pattern, absl::string_view text) {
  auto split = RegexSplit::Compile(pattern);
  EXPECT_TRUE(split.ok()) << split.status();
  std::vector<std::string> pieces;
  for (absl::string_view piece : split->Split(text)) pieces.emplace_back(piece);
  return pieces;
}

TEST(RegexSplitTest, MatchesAndTheStretchesBetweenThemArePieces) {
  EXPECT_THAT(Pieces(R"(\d+)", "ab12cd3"), ElementsAre("ab", "12", "cd", "3"));
  EXPECT_THAT(Pieces(R"(\d+)", "no digits"), ElementsAre("no digits"));
  EXPECT_THAT(Pieces(R"(\d+)", ""), ElementsAre());
}

TEST(RegexSplitTest, UnicodePropertiesAndWhitespaceFollowUnicode) {
  EXPECT_THAT(Pieces(R"(\p{L}+|\p{N}|\s+)", "héllo 中文\u3000٣4"),
              ElementsAre("héllo", " ", "中文", "\u3000", "٣", "4"));
}

TEST(RegexSplitTest, EmptyMatchesCutWithoutLoopingOrDroppingText) {
  // As in the tokenizers crate: an empty match ends the stretch before it and adds no piece.
  EXPECT_THAT(Pieces(R"(x*)", "aéxb"), ElementsAre("a", "é", "x", "b"));
}

TEST(RegexSplitTest, ABadPatternNamesWhereItFails) {
  auto split = RegexSplit::Compile("(unclosed");
  ASSERT_FALSE(split.ok());
  EXPECT_EQ(split.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(split.status().message(), ::testing::HasSubstr("offset 9"));
}

}  // namespace
}  // namespace tandem::engine::text
