#ifndef TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_TESTING_ROUTER_REPLAY_SERVER_H_
#define TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_TESTING_ROUTER_REPLAY_SERVER_H_

// The real router-replay (the binary's core and gRPC front end) for other services' in-process
// tests and benchmarks, which host it on loopback: no fake where the real store can run. The
// only way outside services/router_replay reaches the server's code, and only from testonly
// targets.
#include <memory>

#include "services/router_replay/router_replay_service.h"

namespace tandem::router_replay::testing {

inline absl::StatusOr<std::unique_ptr<grpc::Service>> NewRouterReplayService(
    const RouterReplayOptions& options) {
  auto service = RouterReplayServiceImpl::Create(options);
  if (!service.ok()) return service.status();
  return std::unique_ptr<grpc::Service>(*std::move(service));
}

}  // namespace tandem::router_replay::testing

#endif  // TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_TESTING_ROUTER_REPLAY_SERVER_H_
