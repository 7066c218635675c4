#ifndef TANDEM_COMMON_HEALTH_CLIENT_H_
#define TANDEM_COMMON_HEALTH_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/channel.h"
#include "grpcpp/channel.h"

namespace tandem {

enum class Health { kServing, kNotServing, kUnknownService };

// One standard health check of `service` ("" for the whole server). RPC failures
// (unreachable, deadline) come back as their status.
absl::StatusOr<Health> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                   const std::string& service, absl::Duration timeout);

// Waits until `service` on `server` reports SERVING; DEADLINE_EXCEEDED with the last answer
// otherwise. Uses its own health channel that reconnects every 100 ms and waits for the
// connection (wait_for_ready), so a server that is still starting costs only its start time.
absl::Status WaitUntilServing(ChannelOptions server, const std::string& service,
                              absl::Duration timeout);

}  // namespace tandem

#endif  // TANDEM_COMMON_HEALTH_CLIENT_H_
