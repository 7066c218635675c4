#include "common/health_client.h"

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/status.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace tandem {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

constexpr absl::Duration kPollInterval = absl::Milliseconds(100);

}  // namespace

absl::StatusOr<Health> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                   const std::string& service, absl::Duration timeout) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  SetTimeout(context, timeout);
  HealthCheckRequest request;
  request.set_service(service);
  HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (status.error_code() == grpc::StatusCode::NOT_FOUND) return Health::kUnknownService;
  if (!status.ok()) return FromGrpcStatus(status);
  return response.status() == HealthCheckResponse::SERVING ? Health::kServing : Health::kNotServing;
}

absl::Status WaitUntilServing(const std::shared_ptr<grpc::Channel>& channel,
                              const std::string& service, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status last = absl::UnavailableError("no answer yet");
  while (absl::Now() < deadline) {
    auto health = CheckHealth(channel, service, std::max(kPollInterval, deadline - absl::Now()));
    if (health.ok() && *health == Health::kServing) return absl::OkStatus();
    last = health.ok() ? absl::UnavailableError("NOT_SERVING") : health.status();
    absl::SleepFor(kPollInterval);
  }
  return absl::DeadlineExceededError(absl::StrCat("'", service, "' not SERVING within ",
                                                  absl::FormatDuration(timeout),
                                                  "; last: ", last.ToString()));
}

}  // namespace tandem
