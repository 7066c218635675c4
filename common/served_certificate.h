#ifndef TANDEM_COMMON_SERVED_CERTIFICATE_H_
#define TANDEM_COMMON_SERVED_CERTIFICATE_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tandem {

// Checks PEM files a server is about to serve, before gRPC sees them: gRPC refuses a bad pair
// only inside the handshake, where a server cannot tell why nor keep the pair it had. Returns
// the expiry (notAfter) of the chain's first certificate, or INVALID_ARGUMENT saying what is
// wrong: a chain or client CA bundle without a certificate, a key that does not parse or does
// not belong to the certificate, a certificate already expired at `now`.
absl::StatusOr<absl::Time> CheckServedCertificate(absl::string_view chain_pem,
                                                  absl::string_view key_pem,
                                                  absl::string_view client_ca_pem, absl::Time now);

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVED_CERTIFICATE_H_
