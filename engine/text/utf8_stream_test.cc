#include "engine/text/utf8_stream.h"

#include "gtest/gtest.h"

namespace tandem::engine::text {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";

TEST(Utf8StreamTest, ACharacterSplitAcrossTokensWaitsForItsLastByte) {
  Utf8Stream stream;
  EXPECT_EQ(stream.Append("caf\xC3"), "caf");
  EXPECT_EQ(stream.Append("\xA9!"), "\xC3\xA9!");
  const char emoji[] = "\xF0\x9F\x98\x80";  // U+1F600, one byte per token.
  EXPECT_EQ(stream.Append({emoji, 1}), "");
  EXPECT_EQ(stream.Append({emoji + 1, 1}), "");
  EXPECT_EQ(stream.Append({emoji + 2, 1}), "");
  EXPECT_EQ(stream.Append({emoji + 3, 1}), emoji);
  EXPECT_EQ(stream.Finish(), "");
}

TEST(Utf8StreamTest, BytesThatCanNeverFormACharacterBecomeReplacements) {
  Utf8Stream stream;
  EXPECT_EQ(stream.Append("a\xFF"
                          "b"),
            std::string("a") + kReplacement + "b");
  // A lead byte followed by a non-continuation: one replacement, then the ASCII byte.
  EXPECT_EQ(stream.Append("\xE4"
                          "x"),
            std::string(kReplacement) + "x");
  // Overlong and surrogate forms are ill-formed.
  EXPECT_EQ(LossyUtf8("\xC0\xAF"), std::string(kReplacement) + kReplacement);
  EXPECT_EQ(LossyUtf8("\xED\xA0\x80"), std::string(kReplacement) + kReplacement + kReplacement);
}

TEST(Utf8StreamTest, AnUnfinishedCharacterAtTheEndIsOneReplacement) {
  Utf8Stream stream;
  EXPECT_EQ(stream.Append("ok\xE4\xBD"), "ok");
  EXPECT_EQ(stream.Finish(), kReplacement);
  EXPECT_EQ(stream.Finish(), "");
}

}  // namespace
}  // namespace tandem::engine::text
