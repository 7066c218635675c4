#include "common/server_options.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status.h"

ABSL_FLAG(std::string, host, "0.0.0.0", "Address the gRPC and metrics servers bind to.");
ABSL_FLAG(int, port, -1, "gRPC port; -1 uses the service's default, 0 lets the OS pick.");
ABSL_FLAG(int, metrics_port, -1,
          "Prometheus /metrics port; -1 uses the service's default, 0 lets the OS pick.");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding the bearer token clients must send; if empty, $TANDEM_AUTH_TOKEN; if "
          "neither is set, auth is off.");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain; enables TLS with --tls_key.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle; when set, clients must present a certificate it signed (mTLS).");
ABSL_FLAG(int64_t, max_message_bytes, -1,
          "Largest gRPC message sent or received, in bytes; -1 uses the service's default.");
ABSL_FLAG(absl::Duration, keepalive_time, absl::Seconds(30),
          "Interval of HTTP/2 keepalive pings on idle connections.");
ABSL_FLAG(absl::Duration, keepalive_timeout, absl::Seconds(10),
          "How long a keepalive ping may go unanswered before the connection is closed.");
ABSL_FLAG(absl::Duration, drain_delay, absl::ZeroDuration(),
          "On SIGTERM, how long to report NOT_SERVING before refusing new calls, so load "
          "balancers stop routing here first.");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(30),
          "On SIGTERM, how long in-flight calls may run before they are cancelled.");

namespace tandem {
namespace {

constexpr int64_t kMinMessageBytes = 4 << 10;
constexpr int64_t kMaxMessageBytes = int64_t{2} << 30;  // gRPC's own ceiling is INT_MAX.

absl::StatusOr<int> ResolvePort(absl::string_view flag, int value, int service_default) {
  if (value == -1) return service_default;
  if (value < 0 || value > 65535) {
    return InvalidRequest(
        "INVALID_FLAG",
        absl::StrCat("--", flag, "=", value, " is not a port (0..65535, or -1 for default)"));
  }
  return value;
}

absl::Status CheckPositive(absl::string_view flag, absl::Duration value) {
  if (value <= absl::ZeroDuration()) {
    return InvalidRequest("INVALID_FLAG", absl::StrCat("--", flag, "=", absl::FormatDuration(value),
                                                       " must be positive"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<TlsFiles>> ReadTlsFiles() {
  const std::string cert = absl::GetFlag(FLAGS_tls_cert);
  const std::string key = absl::GetFlag(FLAGS_tls_key);
  const std::string client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  if (cert.empty() && key.empty()) {
    if (!client_ca.empty()) {
      return InvalidRequest("INVALID_FLAG", "--tls_client_ca needs --tls_cert and --tls_key");
    }
    return std::nullopt;
  }
  if (cert.empty() || key.empty()) {
    return InvalidRequest("INVALID_FLAG",
                          absl::StrCat("TLS needs both --tls_cert and --tls_key; got --tls_cert='",
                                       cert, "' --tls_key='", key, "'"));
  }
  for (const std::string& path : {cert, key, client_ca}) {
    if (path.empty()) continue;
    if (absl::StatusOr<std::string> read = ReadSmallFile(path); !read.ok()) return read.status();
  }
  return TlsFiles{.certificate_chain = cert, .private_key = key, .client_ca = client_ca};
}

}  // namespace

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidRequest("UNREADABLE_FILE", absl::StrCat("cannot read file '", path, "'"));
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

absl::Status CheckAuthToken(absl::string_view token, absl::string_view source) {
  if (token.empty()) return InvalidRequest("BAD_TOKEN", absl::StrCat(source, " is empty"));
  if (token.size() < kMinAuthTokenBytes) {
    return InvalidRequest("BAD_TOKEN", absl::StrCat(source, " holds a ", token.size(),
                                                    "-byte token; tokens need at least ",
                                                    kMinAuthTokenBytes, " bytes"));
  }
  for (const char c : token) {
    if (c < '!' || c > '~') {
      return InvalidRequest(
          "BAD_TOKEN",
          absl::StrCat(source, " holds a token with a character outside visible ASCII (byte ",
                       static_cast<int>(static_cast<unsigned char>(c)), ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadAuthToken(const std::string& path) {
  std::string token;
  std::string source;
  if (path.empty()) {
    const char* from_env = std::getenv("TANDEM_AUTH_TOKEN");
    if (from_env == nullptr || *from_env == '\0') return "";
    token = std::string(absl::StripAsciiWhitespace(from_env));
    source = "$TANDEM_AUTH_TOKEN";
  } else {
    absl::StatusOr<std::string> contents = ReadSmallFile(path);
    if (!contents.ok()) return contents.status();
    token = std::string(absl::StripAsciiWhitespace(*contents));
    source = absl::StrCat("auth token file '", path, "'");
  }
  if (absl::Status valid = CheckAuthToken(token, source); !valid.ok()) return valid;
  return token;
}

absl::StatusOr<ServerOptions> ServerOptionsFromFlags(const ServiceDefaults& defaults) {
  ServerOptions options;
  options.host = absl::GetFlag(FLAGS_host);
  if (options.host.empty()) return InvalidRequest("INVALID_FLAG", "--host must not be empty");
  auto port = ResolvePort("port", absl::GetFlag(FLAGS_port), defaults.port);
  if (!port.ok()) return port.status();
  options.port = *port;
  auto metrics_port =
      ResolvePort("metrics_port", absl::GetFlag(FLAGS_metrics_port), defaults.metrics_port);
  if (!metrics_port.ok()) return metrics_port.status();
  options.metrics_port = *metrics_port;
  if (options.port != 0 && options.port == options.metrics_port) {
    return InvalidRequest("INVALID_FLAG",
                          absl::StrCat("--port and --metrics_port are both ", options.port));
  }

  auto token = ReadAuthToken(absl::GetFlag(FLAGS_auth_token_file));
  if (!token.ok()) return token.status();
  options.auth_token = *std::move(token);
  options.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  auto tls = ReadTlsFiles();
  if (!tls.ok()) return tls.status();
  options.tls = *std::move(tls);

  const int64_t max_message = absl::GetFlag(FLAGS_max_message_bytes);
  options.max_message_bytes = max_message == -1 ? defaults.max_message_bytes : max_message;
  if (options.max_message_bytes < kMinMessageBytes ||
      options.max_message_bytes > kMaxMessageBytes) {
    return InvalidRequest("INVALID_FLAG",
                          absl::StrCat("--max_message_bytes=", max_message, " is outside [",
                                       kMinMessageBytes, ", ", kMaxMessageBytes, "]"));
  }

  options.keepalive_time = absl::GetFlag(FLAGS_keepalive_time);
  options.keepalive_timeout = absl::GetFlag(FLAGS_keepalive_timeout);
  options.drain_delay = absl::GetFlag(FLAGS_drain_delay);
  options.drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  for (const auto& [flag, value] :
       {std::pair<absl::string_view, absl::Duration>{"keepalive_time", options.keepalive_time},
        {"keepalive_timeout", options.keepalive_timeout},
        {"drain_timeout", options.drain_timeout}}) {
    if (auto status = CheckPositive(flag, value); !status.ok()) return status;
  }
  if (options.drain_delay < absl::ZeroDuration()) {
    return InvalidRequest("INVALID_FLAG",
                          absl::StrCat("--drain_delay=", absl::FormatDuration(options.drain_delay),
                                       " must not be negative"));
  }
  return options;
}

}  // namespace tandem
