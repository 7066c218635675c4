#include "common/streaming_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tandem {

#if defined(__x86_64__)

namespace {

// Below this, a copy's partial cache lines and fence cost more than the traffic it saves.
constexpr size_t kMinStreamingBytes = 4096;
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

// CopyStreaming's streaming part, with `stream_lines` for the whole cache lines.
void CopyStreamingWith(StreamLines stream_lines, char* destination, const char* source,
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
  // Streaming stores are weakly ordered: fenced before the copy counts as done.
  _mm_sfence();
  std::memcpy(destination + head + lines, source + head + lines, length - head - lines);
}

}  // namespace

void CopyStreaming(char* destination, const char* source, size_t length) {
  CopyStreamingWith(kStreamLines, destination, source, length);
}

namespace internal_streaming_copy {

void CopyStreamingSse2(char* destination, const char* source, size_t length) {
  CopyStreamingWith(StreamLinesSse2, destination, source, length);
}

}  // namespace internal_streaming_copy

#else

void CopyStreaming(char* destination, const char* source, size_t length) {
  std::memcpy(destination, source, length);
}

#endif

}  // namespace tandem
