#ifndef TANDEM_SERVICES_ROUTER_REPLAY_ROUTER_REPLAY_SERVICE_H_
#define TANDEM_SERVICES_ROUTER_REPLAY_ROUTER_REPLAY_SERVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/call_tracker.h"
#include "common/write_stall_guard.h"
#include "services/router_replay/retention_sweeper.h"
#include "services/router_replay/route_store.h"
#include "tandem/routerreplay/v1/router_replay.grpc.pb.h"

namespace tandem::router_replay {

struct RouterReplayOptions {
  RouteStoreOptions store;
  // Records untouched for this long are deleted; zero keeps them until DeleteRecords.
  absl::Duration retention_ttl = absl::ZeroDuration();
  absl::Duration sweep_interval = absl::Minutes(1);
  // FetchRoutes streams served at once; each holds up to one response (a few MiB) while its
  // client reads, so a crowd of stalled clients cannot grow memory without bound.
  int max_fetch_streams = 32;
  // A FetchRoutes stream whose client reads nothing for this long is cancelled, freeing its
  // slot and its response.
  absl::Duration fetch_write_timeout = absl::Minutes(1);
};

// gRPC front end of the router-replay service: converts messages and statuses; the work is done
// by RouteStore (append, seal, delete) and route_queries (fetch, load, placement).
class RouterReplayServiceImpl final
    : public routerreplay::v1::RouterReplayService::CallbackService {
 public:
  static absl::StatusOr<std::unique_ptr<RouterReplayServiceImpl>> Create(
      const RouterReplayOptions& options);
  ~RouterReplayServiceImpl() override = default;

  grpc::ServerReadReactor<routerreplay::v1::AppendRequest>* Append(
      grpc::CallbackServerContext* context, routerreplay::v1::AppendResponse* response) override;
  grpc::ServerUnaryReactor* Seal(grpc::CallbackServerContext* context,
                                 const routerreplay::v1::SealRequest* request,
                                 routerreplay::v1::SealResponse* response) override;
  grpc::ServerWriteReactor<routerreplay::v1::FetchRoutesResponse>* FetchRoutes(
      grpc::CallbackServerContext* context,
      const routerreplay::v1::FetchRoutesRequest* request) override;
  grpc::ServerUnaryReactor* GetExpertLoad(
      grpc::CallbackServerContext* context, const routerreplay::v1::GetExpertLoadRequest* request,
      routerreplay::v1::GetExpertLoadResponse* response) override;
  grpc::ServerUnaryReactor* PlanPlacement(
      grpc::CallbackServerContext* context, const routerreplay::v1::PlanPlacementRequest* request,
      routerreplay::v1::PlanPlacementResponse* response) override;
  grpc::ServerUnaryReactor* PlanBalance(grpc::CallbackServerContext* context,
                                        const routerreplay::v1::PlanBalanceRequest* request,
                                        routerreplay::v1::PlanBalanceResponse* response) override;
  grpc::ServerUnaryReactor* DeleteRecords(
      grpc::CallbackServerContext* context, const routerreplay::v1::DeleteRecordsRequest* request,
      routerreplay::v1::DeleteRecordsResponse* response) override;

 private:
  RouterReplayServiceImpl(std::unique_ptr<RouteStore> store, const RouterReplayOptions& options);

  std::unique_ptr<RouteStore> store_;
  // Returns freed memory to the system, at most every kMinTrimInterval.
  void TrimMemory();

  const int max_fetch_streams_;
  absl::Mutex trim_mutex_;
  absl::Time last_trim_ ABSL_GUARDED_BY(trim_mutex_) = absl::InfinitePast();
  CallTracker fetch_streams_;
  WriteStallGuard fetch_stalls_;
  std::unique_ptr<RetentionSweeper> sweeper_;  // Declared after store_: stops before it closes.
};

}  // namespace tandem::router_replay

#endif  // TANDEM_SERVICES_ROUTER_REPLAY_ROUTER_REPLAY_SERVICE_H_
