#include "common/checksum.h"

#include <cstddef>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

// Long enough to cross XXH3's internal 256-byte buffer and 1 KiB stripe
// blocks several times.
std::string TestData() {
  std::string data(5000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 131 + 7) % 251);
  return data;
}

TEST(ChecksumTest, KnownValueOfEmptyInput) {
  EXPECT_EQ(Xxh3Checksum(""), 0x2D06800538D394C2u);
  EXPECT_EQ(Xxh3Hasher().Digest(), 0x2D06800538D394C2u);
}

TEST(ChecksumTest, ByteSpanMatchesString) {
  const std::string data = TestData();
  const std::vector<std::byte> bytes(reinterpret_cast<const std::byte*>(data.data()),
                                     reinterpret_cast<const std::byte*>(data.data() + data.size()));
  EXPECT_EQ(Xxh3Checksum(bytes), Xxh3Checksum(data));
  EXPECT_NE(Xxh3Checksum(data), Xxh3Checksum(data.substr(1)));
}

TEST(ChecksumTest, HexIsZeroPaddedLowercase) {
  EXPECT_EQ(ChecksumToHex(0x2D06800538D394C2u), "2d06800538d394c2");
  EXPECT_EQ(ChecksumToHex(0xabu), "00000000000000ab");
  EXPECT_EQ(ChecksumToHex(0), "0000000000000000");
}

TEST(Xxh3HasherTest, StreamingEqualsOneShotForAnyChunking) {
  const std::string data = TestData();
  const uint64_t expected = Xxh3Checksum(data);
  for (size_t chunk : {1, 3, 64, 255, 256, 257, 1024, 4999, 5000}) {
    Xxh3Hasher hasher;
    for (size_t offset = 0; offset < data.size(); offset += chunk) {
      hasher.Update(absl::string_view(data).substr(offset, chunk));
    }
    EXPECT_EQ(hasher.Digest(), expected) << "chunk " << chunk;
  }
}

TEST(Xxh3HasherTest, DigestDoesNotConsumeState) {
  Xxh3Hasher hasher;
  hasher.Update("abc");
  const uint64_t first = hasher.Digest();
  EXPECT_EQ(hasher.Digest(), first);
  hasher.Update("def");
  EXPECT_EQ(hasher.Digest(), Xxh3Checksum("abcdef"));
}

TEST(Xxh3HasherTest, ResetStartsOver) {
  Xxh3Hasher hasher;
  hasher.Update("stale");
  hasher.Reset();
  const std::string data = TestData();
  hasher.Update(absl::MakeConstSpan(reinterpret_cast<const std::byte*>(data.data()), data.size()));
  EXPECT_EQ(hasher.Digest(), Xxh3Checksum(data));
}

TEST(Xxh3HasherTest, CopiesHashIndependently) {
  Xxh3Hasher original;
  original.Update("shared prefix ");
  Xxh3Hasher copy = original;
  original.Update("one");
  copy.Update("two");
  EXPECT_EQ(original.Digest(), Xxh3Checksum("shared prefix one"));
  EXPECT_EQ(copy.Digest(), Xxh3Checksum("shared prefix two"));
}

}  // namespace
}  // namespace tandem
