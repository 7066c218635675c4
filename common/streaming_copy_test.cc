#include "common/streaming_copy.h"

#include <cstddef>
#include <string>
#include <vector>

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
  for (size_t length : {0, 1, 63, 64, 65, 4095, 4096, 4097, 5000, 65536 + 17}) {
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
  ExpectExactCopies(internal_streaming_copy::CopyStreamingSse2);
}
#endif

}  // namespace
}  // namespace tandem
