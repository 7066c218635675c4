#ifndef TANDEM_COMMON_SHA256_H_
#define TANDEM_COMMON_SHA256_H_

#include <array>

#include "absl/strings/string_view.h"

namespace tandem {

using Sha256Digest = std::array<unsigned char, 32>;

// SHA-256 (OpenSSL) of `bytes`: where a collision must not be constructible, unlike xxh3's.
Sha256Digest Sha256(absl::string_view bytes);

}  // namespace tandem

#endif  // TANDEM_COMMON_SHA256_H_
