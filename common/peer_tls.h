#ifndef TANDEM_COMMON_PEER_TLS_H_
#define TANDEM_COMMON_PEER_TLS_H_

#include <optional>

#include "absl/status/statusor.h"
#include "common/channel.h"

namespace tandem {

// How a service dials the other Tandem services (the trainer and rollout do), from
// --peer_tls_ca (PEM CA bundle: dial over TLS, verifying their certificates against it),
// --peer_tls_cert and --peer_tls_key (a client certificate, for servers that require mTLS) and
// --peer_tls_server_name (the name to verify instead of the dialed host). nullopt when
// --peer_tls_ca is empty: plaintext. INVALID_ARGUMENT naming the flag for an incomplete set or
// an unreadable file.
absl::StatusOr<std::optional<ClientTls>> PeerTlsFromFlags();

}  // namespace tandem

#endif  // TANDEM_COMMON_PEER_TLS_H_
