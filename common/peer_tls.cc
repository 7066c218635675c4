#include "common/peer_tls.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/server_options.h"
#include "common/status.h"

ABSL_FLAG(std::string, peer_tls_ca, "",
          "PEM CA bundle of the other services' certificates: dial them over TLS. Empty: "
          "plaintext.");
ABSL_FLAG(std::string, peer_tls_cert, "",
          "PEM client certificate chain for servers that require mTLS (with --peer_tls_key).");
ABSL_FLAG(std::string, peer_tls_key, "", "PEM private key of --peer_tls_cert.");
ABSL_FLAG(std::string, peer_tls_server_name, "",
          "Name to verify in the other services' certificates instead of the dialed host.");

namespace tandem {
namespace {

absl::StatusOr<std::string> ReadFlagFile(const char* flag, const std::string& path) {
  auto contents = ReadSmallFile(path);
  if (!contents.ok()) {
    return Annotate(contents.status(), absl::StrCat("--", flag, "='", path, "': "));
  }
  return contents;
}

}  // namespace

absl::StatusOr<std::optional<ClientTls>> PeerTlsFromFlags() {
  const std::string ca = absl::GetFlag(FLAGS_peer_tls_ca);
  const std::string cert = absl::GetFlag(FLAGS_peer_tls_cert);
  const std::string key = absl::GetFlag(FLAGS_peer_tls_key);
  if (ca.empty()) {
    if (!cert.empty() || !key.empty() || !absl::GetFlag(FLAGS_peer_tls_server_name).empty()) {
      return InvalidRequest(
          "INVALID_FLAG",
          "--peer_tls_cert, --peer_tls_key and --peer_tls_server_name need --peer_tls_ca");
    }
    return std::nullopt;
  }
  if (cert.empty() != key.empty()) {
    return InvalidRequest(
        "INVALID_FLAG",
        absl::StrCat("mTLS needs both --peer_tls_cert and --peer_tls_key; got --peer_tls_cert='",
                     cert, "' --peer_tls_key='", key, "'"));
  }
  for (const auto& [flag, path] : {std::pair{"peer_tls_ca", ca}, std::pair{"peer_tls_cert", cert},
                                   std::pair{"peer_tls_key", key}}) {
    if (path.empty()) continue;
    if (auto read = ReadFlagFile(flag, path); !read.ok()) return read.status();
  }
  return ClientTls{.root_ca = ca,
                   .certificate_chain = cert,
                   .private_key = key,
                   .server_name_override = absl::GetFlag(FLAGS_peer_tls_server_name)};
}

}  // namespace tandem
