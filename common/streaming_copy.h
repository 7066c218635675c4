#ifndef TANDEM_COMMON_STREAMING_COPY_H_
#define TANDEM_COMMON_STREAMING_COPY_H_

#include <cstddef>

namespace tandem {

// memcpy with non-temporal (streaming) stores, for copies much larger than the cache whose
// destination is not read again soon: each destination cache line is written whole without
// being read first (no read-for-ownership) and without evicting what the cache holds, a third
// less memory traffic than memcpy's ordinary stores below glibc's own non-temporal threshold.
// The bytes are visible to other threads on return. Copies under a few KiB, and CPUs without
// streaming stores, use memcpy.
void CopyStreaming(char* destination, const char* source, size_t length);

#if defined(__x86_64__)
namespace internal_streaming_copy {
// CopyStreaming with SSE2's stores, which CPUs without AVX2 get: for tests.
void CopyStreamingSse2(char* destination, const char* source, size_t length);
}  // namespace internal_streaming_copy
#endif

}  // namespace tandem

#endif  // TANDEM_COMMON_STREAMING_COPY_H_
