#include "common/sha256.h"

#include <openssl/evp.h>

namespace tandem {

Sha256Digest Sha256(absl::string_view bytes) {
  Sha256Digest digest{};
  unsigned int length = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest.data(), &length, EVP_sha256(), nullptr);
  return digest;
}

}  // namespace tandem
