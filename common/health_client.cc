#include "common/health_client.h"

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/status.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace tandem {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// How often a NOT_SERVING server is asked again, and the longest reconnect backoff while waiting.
constexpr absl::Duration kPollInterval = absl::Milliseconds(100);

absl::StatusOr<Health> Check(const std::shared_ptr<grpc::Channel>& channel,
                             const std::string& service, absl::Duration timeout,
                             bool wait_for_ready) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  SetTimeout(context, timeout);
  context.set_wait_for_ready(wait_for_ready);
  HealthCheckRequest request;
  request.set_service(service);
  HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (status.error_code() == grpc::StatusCode::NOT_FOUND) return Health::kUnknownService;
  if (!status.ok()) return FromGrpcStatus(status);
  return response.status() == HealthCheckResponse::SERVING ? Health::kServing : Health::kNotServing;
}

const char* ChannelStateName(grpc_connectivity_state state) {
  switch (state) {
    case GRPC_CHANNEL_IDLE:
      return "IDLE";
    case GRPC_CHANNEL_CONNECTING:
      return "CONNECTING";
    case GRPC_CHANNEL_READY:
      return "READY";
    case GRPC_CHANNEL_TRANSIENT_FAILURE:
      return "TRANSIENT_FAILURE (refused, unreachable, or TLS handshake failed)";
    case GRPC_CHANNEL_SHUTDOWN:
      return "SHUTDOWN";
  }
  return "unknown";
}

}  // namespace

absl::StatusOr<Health> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                   const std::string& service, absl::Duration timeout) {
  return Check(channel, service, timeout, /*wait_for_ready=*/false);
}

absl::Status WaitUntilServing(ChannelOptions server, const std::string& service,
                              absl::Duration timeout) {
  server.service_name = "grpc.health.v1.Health";
  server.max_reconnect_backoff = kPollInterval;
  auto channel = CreateChannel(server);
  if (!channel.ok()) return channel.status();
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status last = absl::UnavailableError("no answer yet");
  while (absl::Now() < deadline) {
    auto health = Check(*channel, service, deadline - absl::Now(), /*wait_for_ready=*/true);
    if (health.ok() && *health == Health::kServing) return absl::OkStatus();
    last = health.ok() ? absl::UnavailableError(*health == Health::kNotServing
                                                    ? "NOT_SERVING"
                                                    : "unknown service")
                       : health.status();
    absl::SleepFor(std::min(kPollInterval, std::max(deadline - absl::Now(), absl::ZeroDuration())));
  }
  // A server that never answered leaves only DEADLINE_EXCEEDED from wait_for_ready; the channel
  // state tells a refused connection or failed TLS handshake (TRANSIENT_FAILURE) from a slow one.
  return absl::DeadlineExceededError(absl::StrCat(
      "'", service, "' not SERVING within ", absl::FormatDuration(timeout), "; last: ",
      last.ToString(), "; connection ", ChannelStateName((*channel)->GetState(false))));
}

}  // namespace tandem
