#ifndef TANDEM_COMMON_CHANNEL_H_
#define TANDEM_COMMON_CHANNEL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"

namespace tandem {

// PEM files (paths), read again when they change, so that new connections use renewed
// certificates without a restart.
struct ClientTls {
  std::string root_ca;            // Empty uses the system roots.
  std::string certificate_chain;  // Set with private_key for mutual TLS.
  std::string private_key;
  std::string server_name_override;  // For certificates issued to a name other than the target.
};

// How a client reaches one Tandem service.
struct ChannelOptions {
  std::string target;        // "host:port" or any gRPC target URI.
  std::string service_name;  // Full proto name ("tandem.trainer.v1.JobService"); drives retries.
  // Other services of the same server reached on this channel, retried by the same rule (e.g.
  // the weight-store's internal UCX data plane).
  std::vector<std::string> also_services;
  std::string auth_token;    // Sent as "authorization: Bearer <token>" when non-empty.
  // Or the token in this file, read again when it changes (a renewed Secret); wins if set.
  std::string auth_token_file;
  std::optional<ClientTls> tls;
  int64_t max_message_bytes = 64 << 20;
  absl::Duration keepalive_time = absl::Seconds(30);
  absl::Duration keepalive_timeout = absl::Seconds(10);
  int max_attempts = 4;  // Including the first; gRPC caps it at 5.
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(2);
  // Longest wait between two connection attempts to an unreachable server; unset: gRPC's
  // default (1 s growing to 120 s). Waiting for a server that is starting wants it short.
  std::optional<absl::Duration> max_reconnect_backoff;
};

// The gRPC service config that retries UNAVAILABLE for every idempotent method of
// `service_name` and `also_services`: the methods whose proto declares `option
// idempotency_level` as IDEMPOTENT or NO_SIDE_EFFECTS. Reading the proto keeps the list in one
// place. NOT_FOUND when a service is not linked into this binary.
absl::StatusOr<std::string> RetryServiceConfig(const ChannelOptions& options);

// A channel with keepalive, message limits, retries per RetryServiceConfig, TLS if asked,
// and the bearer token on every call.
absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateChannel(const ChannelOptions& options);

// Every client call in Tandem has a deadline; this sets it `timeout` from now.
void SetTimeout(grpc::ClientContext& context, absl::Duration timeout);

}  // namespace tandem

#endif  // TANDEM_COMMON_CHANNEL_H_
