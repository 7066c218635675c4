#ifndef TANDEM_SERVICES_ROUTER_REPLAY_ROUTE_QUERIES_H_
#define TANDEM_SERVICES_ROUTER_REPLAY_ROUTE_QUERIES_H_

// The server's planning of FetchRoutes, GetExpertLoad and PlanPlacement against the store.

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "services/router_replay/client/route_wire.h"
#include "services/router_replay/route_store.h"
#include "tandem/routerreplay/v1/router_replay.pb.h"

namespace tandem::router_replay {

// Rows [begin, end) of a record.
struct RowSpan {
  int64_t begin = 0;
  int64_t end = 0;
};

// One record of a fetch, resolved against the store.
struct FetchItem {
  RecordKey key;
  std::optional<RecordInfo> record;  // Absent: MISSING.
  routerreplay::v1::RecordStatus status = routerreplay::v1::RECORD_STATUS_UNSPECIFIED;
  std::vector<RowSpan> spans;        // Requested rows, in order.
  std::vector<int> layer_positions;  // Positions in record->shape.layers to return, in order.
  int64_t requested_rows = 0;
};

// Everything a FetchRoutes call returns, resolved and checked before any data is sent.
struct FetchPlan {
  std::vector<FetchItem> items;
  int64_t max_chunk_bytes = 0;
  bool allow_partial = false;  // A record deleted mid-fetch then ends MISSING, not the fetch.
};

// Validates a FetchRoutes request and resolves its selection, data-parallel shard, layers and
// row ranges (see router_replay.proto for every rule and message).
absl::StatusOr<FetchPlan> PlanFetch(const RouteStore& store,
                                    const routerreplay::v1::FetchRoutesRequest& request);

// Produces a plan's response messages one at a time, so memory stays at one message.
class FetchCursor {
 public:
  FetchCursor(const RouteStore& store, FetchPlan plan) : store_(store), plan_(std::move(plan)) {}

  // The next message, or std::nullopt when done.
  absl::StatusOr<std::optional<routerreplay::v1::FetchRoutesResponse>> Next();

 private:
  absl::Status FillRows(const FetchItem& item, int64_t first, int64_t count,
                        routerreplay::v1::FetchRoutesResponse& response);
  // The MISSING message that ends the current record, found deleted after row_ of its rows.
  routerreplay::v1::FetchRoutesResponse EndDeleted();

  const RouteStore& store_;
  FetchPlan plan_;
  size_t item_ = 0;
  int64_t row_ = 0;  // Within the current item's requested rows.
  std::vector<int16_t> record_rows_;
};

// Expert assignment counts (GetExpertLoad).
absl::StatusOr<routerreplay::v1::GetExpertLoadResponse> CountExpertLoad(
    const RouteStore& store, const routerreplay::v1::GetExpertLoadRequest& request);

// Hierarchical EPLB for explicit or recorded loads (PlanPlacement).
absl::StatusOr<routerreplay::v1::PlanPlacementResponse> PlanExpertPlacement(
    const RouteStore& store, const routerreplay::v1::PlanPlacementRequest& request);

// Checks a VersionRange and returns it as [begin, end), end 0 = unbounded. `path` is the range's
// field path from the request root, which an INVALID_ARGUMENT's details name ("versions.end").
absl::StatusOr<RowSpan> VersionSpan(const routerreplay::v1::VersionRange& versions,
                                    absl::string_view path = "versions");

}  // namespace tandem::router_replay

#endif  // TANDEM_SERVICES_ROUTER_REPLAY_ROUTE_QUERIES_H_
