#include "common/streaming_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tandem {

#if defined(__x86_64__)

namespace {

// Below this, a copy's partial cache lines at either end are most of it.
constexpr size_t kMinStreamingBytes = 256;
constexpr size_t kLine = 64;

// Streams `bytes` (whole cache lines) to a line-aligned `destination`.
__attribute__((target("avx2"))) void StreamLinesAvx2(char* destination, const char* source,
                                                     size_t bytes) {
  for (size_t i = 0; i < bytes; i += 32) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(destination + i),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(source + i)));
  }
}

// SSE2: every x86-64 CPU has it.
void StreamLinesSse2(char* destination, const char* source, size_t bytes) {
  for (size_t i = 0; i < bytes; i += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(destination + i),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(source + i)));
  }
}

using StreamLines = void (*)(char*, const char*, size_t);
const StreamLines kStreamLines = [] {
  __builtin_cpu_init();  // This may run before libgcc's own initializer.
  return __builtin_cpu_supports("avx2") ? StreamLinesAvx2 : StreamLinesSse2;
}();

// A copy with `stream_lines` for its whole cache lines, not fenced.
void CopyUnfencedWith(StreamLines stream_lines, char* destination, const char* source,
                      size_t length) {
  if (length < kMinStreamingBytes) {
    std::memcpy(destination, source, length);
    return;
  }
  // The partial lines at either end by memcpy, the whole ones between streamed.
  const size_t head = (kLine - reinterpret_cast<uintptr_t>(destination) % kLine) % kLine;
  const size_t lines = (length - head) / kLine * kLine;
  std::memcpy(destination, source, head);
  stream_lines(destination + head, source + head, lines);
  std::memcpy(destination + head + lines, source + head + lines, length - head - lines);
}

}  // namespace

// Streaming stores are weakly ordered: fenced before the copies count as done.
StreamingCopier::~StreamingCopier() { _mm_sfence(); }

void StreamingCopier::Copy(char* destination, const char* source, size_t length) {
  CopyUnfencedWith(kStreamLines, destination, source, length);
}

namespace internal_streaming_copy {

void CopySse2Unfenced(char* destination, const char* source, size_t length) {
  CopyUnfencedWith(StreamLinesSse2, destination, source, length);
}

}  // namespace internal_streaming_copy

#else

StreamingCopier::~StreamingCopier() = default;

void StreamingCopier::Copy(char* destination, const char* source, size_t length) {
  std::memcpy(destination, source, length);
}

#endif

void CopyStreaming(char* destination, const char* source, size_t length) {
  StreamingCopier().Copy(destination, source, length);
}

}  // namespace tandem
