#ifndef TANDEM_COMMON_STREAMING_COPY_H_
#define TANDEM_COMMON_STREAMING_COPY_H_

#include <cstddef>

namespace tandem {

// memcpy with non-temporal (streaming) stores, for copies whose destination is not read again
// soon, together much larger than the cache: each whole destination cache line is written
// without being read first (no read-for-ownership) and without evicting what the cache holds, a
// third less memory traffic than memcpy's ordinary stores below glibc's own non-temporal
// threshold. Streaming stores are weakly ordered, and the fence that orders them costs about
// as much as streaming a few KiB: a copier fences once, when it is destroyed, for all its
// copies, so that many small ones (a read plan's blocks of a few hundred bytes) stream too.
// Copies of a few cache lines or less, and CPUs without streaming stores, use memcpy.
class StreamingCopier {
 public:
  StreamingCopier() = default;
  StreamingCopier(const StreamingCopier&) = delete;
  StreamingCopier& operator=(const StreamingCopier&) = delete;
  // The bytes of every copy are visible to other threads once this returns.
  ~StreamingCopier();

  void Copy(char* destination, const char* source, size_t length);
};

// One streaming copy, visible to other threads on return.
void CopyStreaming(char* destination, const char* source, size_t length);

#if defined(__x86_64__)
namespace internal_streaming_copy {
// StreamingCopier::Copy with SSE2's stores, which CPUs without AVX2 get, unfenced: for tests.
void CopySse2Unfenced(char* destination, const char* source, size_t length);
}  // namespace internal_streaming_copy
#endif

}  // namespace tandem

#endif  // TANDEM_COMMON_STREAMING_COPY_H_
