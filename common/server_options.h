#ifndef TANDEM_COMMON_SERVER_OPTIONS_H_
#define TANDEM_COMMON_SERVER_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tandem {

// PEM files for TLS (paths; read again when they change); mutual TLS when client_ca is set.
struct TlsFiles {
  std::string certificate_chain;
  std::string private_key;
  std::string client_ca;  // Empty: clients are not asked for certificates.
};

// Everything the shared server bootstrap needs, resolved and validated from flags.
struct ServerOptions {
  std::string host = "0.0.0.0";
  int port = 0;            // 0: the OS picks one (tests); the bound port is reported after start.
  int metrics_port = 0;    // Same rule, for the Prometheus /metrics endpoint.
  std::string auth_token;  // A fixed token ($TANDEM_AUTH_TOKEN); empty: see the file.
  std::string auth_token_file;  // Its file, read again when it changes; both empty: auth off.
  std::optional<TlsFiles> tls;  // Unset: plaintext.
  // How often, at most, changed TLS and token files are noticed.
  absl::Duration credentials_check_interval = absl::Seconds(1);
  // How long the previous token is still accepted after the token file changed.
  absl::Duration previous_token_grace = absl::Minutes(5);
  int64_t max_message_bytes = 64 << 20;
  absl::Duration keepalive_time = absl::Seconds(30);
  absl::Duration keepalive_timeout = absl::Seconds(10);
  absl::Duration drain_delay = absl::ZeroDuration();  // NOT_SERVING before refusing calls.
  absl::Duration drain_timeout = absl::Seconds(30);   // In-flight calls get this long.
};

// The per-service defaults a binary passes in; the flags override them.
struct ServiceDefaults {
  int port;
  int metrics_port;
  int64_t max_message_bytes;
};

// Reads --host, --port, --metrics_port, --auth_token_file (or $TANDEM_AUTH_TOKEN),
// --tls_cert, --tls_key, --tls_client_ca, --max_message_bytes, --keepalive_time,
// --keepalive_timeout, --drain_delay and --drain_timeout. Returns INVALID_ARGUMENT naming the
// flag and its value when one is out of range, a file cannot be read, or TLS files are
// incomplete.
absl::StatusOr<ServerOptions> ServerOptionsFromFlags(const ServiceDefaults& defaults);

// Bearer tokens shorter than this are refused: a token that short is guessable, and one that
// suddenly is that short is usually a file caught empty or half-written.
inline constexpr size_t kMinAuthTokenBytes = 16;

// OK when `token` (whitespace around it already dropped) may be a bearer token: at least
// kMinAuthTokenBytes of visible ASCII (what an HTTP/2 header value carries unchanged).
// INVALID_ARGUMENT naming `source` (a file or variable) and what is wrong, never the token.
absl::Status CheckAuthToken(absl::string_view token, absl::string_view source);

// Reads a bearer token from a file (whitespace around it is dropped) or, when `path` is
// empty, from $TANDEM_AUTH_TOKEN. Returns "" when neither is set; an unreadable file or a
// token CheckAuthToken refuses is an error: it almost always means a broken secret mount.
absl::StatusOr<std::string> ReadAuthToken(const std::string& path);

// Reads a whole file, for PEM and token files.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path);

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVER_OPTIONS_H_
