#include "engine/text/byte_level.h"

#include <string>

#include "gtest/gtest.h"

namespace tandem::engine::text {
namespace {

TEST(ByteLevelTest, EveryByteRoundTrips) {
  std::string all_bytes;
  for (int byte = 0; byte < 256; ++byte) all_bytes.push_back(static_cast<char>(byte));
  const std::string spelled = ToByteLevel(all_bytes);
  EXPECT_EQ(FromByteLevel(spelled), all_bytes);
}

TEST(ByteLevelTest, PrintableBytesStandForThemselvesAndTheSpaceIsGDot) {
  EXPECT_EQ(ToByteLevel("Hi!"), "Hi!");
  EXPECT_EQ(ToByteLevel(" "), "\xC4\xA0");   // U+0120 'Ġ'
  EXPECT_EQ(ToByteLevel("\n"), "\xC4\x8A");  // U+010A 'Ċ'
  // "你" byte by byte: 0xE4 'ä' and 0xBD '½' stand for themselves, 0xA0 (no-break space) is
  // the 67th byte that does not, U+0142 'ł'.
  EXPECT_EQ(ToByteLevel("\xE4\xBD\xA0"), "\xC3\xA4\xC2\xBD\xC5\x82");
}

TEST(ByteLevelTest, CharactersOutsideTheAlphabetAreRefused) {
  EXPECT_EQ(FromByteLevel("\xE4\xBD\xA0"), std::nullopt);  // "你" is not one of the 256.
  EXPECT_EQ(FromByteLevel(" "), std::nullopt);             // The space is spelled "Ġ".
}

}  // namespace
}  // namespace tandem::engine::text
