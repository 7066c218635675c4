#include "common/utf8.h"

#include "gtest/gtest.h"
#include "tandem/trainer/v1/trainer.pb.h"

namespace tandem {
namespace {

TEST(Utf8Test, WellFormedTextIsKept) {
  for (const char* text : {"", "plain ascii", "caf\xC3\xA9", "\xE2\x82\xAC 5", "\xF0\x9F\x98\x80",
                           "\xF4\x8F\xBF\xBF"}) {
    EXPECT_TRUE(IsValidUtf8(text)) << text;
    EXPECT_EQ(ValidUtf8(text), text);
  }
}

TEST(Utf8Test, EveryKindOfMalformedSequenceIsEscapedByteByByte) {
  EXPECT_EQ(ValidUtf8("a\xFF" "b"), "a\\xFFb");
  EXPECT_EQ(ValidUtf8("\x80"), "\\x80");                      // Lone continuation.
  EXPECT_EQ(ValidUtf8("\xC0\xAF"), "\\xC0\\xAF");             // Overlong '/'.
  EXPECT_EQ(ValidUtf8("\xE0\x80\xAF"), "\\xE0\\x80\\xAF");    // Overlong, 3 bytes.
  EXPECT_EQ(ValidUtf8("\xED\xA0\x80"), "\\xED\\xA0\\x80");    // Surrogate U+D800.
  EXPECT_EQ(ValidUtf8("\xF4\x90\x80\x80"), "\\xF4\\x90\\x80\\x80");  // Above U+10FFFF.
  EXPECT_EQ(ValidUtf8("\xC3"), "\\xC3");                      // Truncated at the end.
  EXPECT_EQ(ValidUtf8("\xE2\x82" "x"), "\\xE2\\x82x");
  for (const char* bad : {"\xFF", "\xC0\xAF", "\xED\xA0\x80", "\xC3"}) {
    EXPECT_FALSE(IsValidUtf8(bad));
    EXPECT_TRUE(IsValidUtf8(ValidUtf8(bad)));
  }
}

TEST(Utf8Test, AnEscapedMessageSurvivesAProtoRoundTrip) {
  trainer::v1::Job job;
  job.set_error_message(ValidUtf8("safetensors header: \xFF\xFE not JSON"));
  std::string bytes;
  ASSERT_TRUE(job.SerializeToString(&bytes));
  trainer::v1::Job parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  EXPECT_EQ(parsed.error_message(), "safetensors header: \\xFF\\xFE not JSON");
}

}  // namespace
}  // namespace tandem
