#ifndef TANDEM_COMMON_CHECKSUM_H_
#define TANDEM_COMMON_CHECKSUM_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

// Exposes XXH3_state_t's layout so the hasher can hold it by value instead of
// heap-allocating it (which could fail and leave a null state behind).
#ifndef XXH_STATIC_LINKING_ONLY
#define XXH_STATIC_LINKING_ONLY
#endif
#include <xxhash.h>

namespace tandem {

// XXH3-64 with seed 0: the checksum every service attaches to weight data.
uint64_t Xxh3Checksum(absl::string_view data);
uint64_t Xxh3Checksum(absl::Span<const std::byte> data);

// 16 lowercase hex digits, zero-padded: "2d06800538d394c2".
std::string ChecksumToHex(uint64_t checksum);

// Incremental XXH3-64 for data that arrives in chunks (uploads, streamed
// tensors). Digest() equals Xxh3Checksum over the concatenation of every
// Update since construction or the last Reset, however it was chunked.
class Xxh3Hasher {
 public:
  Xxh3Hasher();

  void Update(absl::string_view data);
  void Update(absl::Span<const std::byte> data);
  uint64_t Digest() const;
  void Reset();

 private:
  XXH3_state_t state_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_CHECKSUM_H_
