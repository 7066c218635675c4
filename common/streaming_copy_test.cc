#include "common/streaming_copy.h"

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "gtest/gtest.h"

namespace tandem {
namespace {

std::string Pattern(size_t length) {
  std::string bytes(length, '\0');
  for (size_t i = 0; i < length; ++i) bytes[i] = static_cast<char>(i * 131 + i / 251);
  return bytes;
}

using Copy = void (*)(char*, const char*, size_t);

// Every alignment of source and destination, around the streaming threshold and the cache
// line: the bytes copied are the source's, and the bytes around them untouched.
void ExpectExactCopies(Copy copy) {
  const std::string source = Pattern(70000);
  for (size_t length : {0, 1, 63, 64, 65, 255, 256, 257, 1000, 4096, 5000, 65536 + 17}) {
    for (size_t source_offset : {0, 1, 31, 32, 63}) {
      for (size_t destination_offset : {0, 1, 7, 32, 63}) {
        std::string destination(length + 128, '#');
        copy(destination.data() + destination_offset, source.data() + source_offset, length);
        ASSERT_EQ(destination.substr(destination_offset, length),
                  source.substr(source_offset, length))
            << length << " " << source_offset << " " << destination_offset;
        ASSERT_EQ(destination.substr(0, destination_offset), std::string(destination_offset, '#'));
        ASSERT_EQ(destination.substr(destination_offset + length),
                  std::string(128 - destination_offset, '#'));
      }
    }
  }
}

TEST(StreamingCopyTest, CopiesExactlyTheBytesAtEveryAlignmentAndLength) {
  ExpectExactCopies(CopyStreaming);
}

#if defined(__x86_64__)
TEST(StreamingCopyTest, Sse2StoresCopyExactlyTheBytesToo) {
  ExpectExactCopies([](char* destination, const char* source, size_t length) {
    internal_streaming_copy::CopySse2Unfenced(destination, source, length);
    _mm_sfence();
  });
}
#endif

// A read plan's blocks: many copies of a few hundred bytes to a few KiB, strided, interleaved
// with their neighbours' partial cache lines, all through one copier.
TEST(StreamingCopyTest, ACopierCopiesEveryBlockExactly) {
  const std::string source = Pattern(1 << 20);
  std::string destination(source.size() + 64, '#');
  {
    StreamingCopier copier;
    size_t offset = 0;
    for (size_t i = 0; offset < source.size(); ++i) {
      const size_t length = std::min(source.size() - offset, 1 + i * 97 % 3000);
      // Every other block first, then the ones between: neighbours share partial lines.
      if (i % 2 == 0) copier.Copy(destination.data() + 3 + offset, source.data() + offset, length);
      offset += length;
    }
    offset = 0;
    for (size_t i = 0; offset < source.size(); ++i) {
      const size_t length = std::min(source.size() - offset, 1 + i * 97 % 3000);
      if (i % 2 == 1) copier.Copy(destination.data() + 3 + offset, source.data() + offset, length);
      offset += length;
    }
  }
  EXPECT_EQ(destination.substr(3, source.size()), source);
  EXPECT_EQ(destination.substr(0, 3), "###");
  EXPECT_EQ(destination.substr(3 + source.size()), std::string(61, '#'));
}

}  // namespace
}  // namespace tandem
