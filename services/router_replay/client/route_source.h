#ifndef TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_ROUTE_SOURCE_H_
#define TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_ROUTE_SOURCE_H_

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "services/router_replay/client/replay_fetch.h"
#include "tandem/routerreplay/v1/router_replay.grpc.pb.h"

namespace tandem::router_replay {

// Where a trainer reads the routes it replays: router-replay (RouterReplaySource), or
// testing::FakeRouteSource in unit tests. The read side of RouteSink.
class RouteSource {
 public:
  virtual ~RouteSource() = default;
  // A training batch's routes in the engine's replay layout (FetchReplayRoutes' contract).
  virtual absl::StatusOr<ReplayRoutes> Fetch(absl::Span<const ReplaySequence> sequences,
                                             const ReplayFetchOptions& options) = 0;
};

// Router-replay's routes, by FetchReplayRoutes over `stub` (not owned).
class RouterReplaySource final : public RouteSource {
 public:
  explicit RouterReplaySource(routerreplay::v1::RouterReplayService::StubInterface& stub)
      : stub_(stub) {}
  absl::StatusOr<ReplayRoutes> Fetch(absl::Span<const ReplaySequence> sequences,
                                     const ReplayFetchOptions& options) override {
    return FetchReplayRoutes(stub_, sequences, options);
  }

 private:
  routerreplay::v1::RouterReplayService::StubInterface& stub_;
};

}  // namespace tandem::router_replay

#endif  // TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_ROUTE_SOURCE_H_
