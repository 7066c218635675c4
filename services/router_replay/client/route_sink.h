#ifndef TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_ROUTE_SINK_H_
#define TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_ROUTE_SINK_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "services/router_replay/client/record_key.h"
#include "services/router_replay/client/route_wire.h"

namespace tandem::router_replay {

// Where a rollout replica's recorded routes go: router-replay through RouteAppender, or
// testing::FakeRouteSink in the scheduler's tests. Thread-safe.
class RouteSink {
 public:
  virtual ~RouteSink() = default;

  // Queues (copies) rows [first_row, first_row + num_rows) of a record, [num_rows, layers,
  // top_k], sealing it after them when `seal`. Errors: INVALID_ARGUMENT for a bad key or shape,
  // RESOURCE_EXHAUSTED when there is no room for them, and the record's own error if an
  // earlier chunk of it already failed.
  virtual absl::Status Append(const RecordKey& key, const RouteShape& shape, int64_t first_row,
                              int64_t num_rows, const int16_t* rows, bool seal) = 0;

  // Waits until every chunk queued so far for the record is durable; returns OK, or the error
  // that failed the record, or DEADLINE_EXCEEDED.
  virtual absl::Status WaitForRecord(const RecordKey& key, absl::Time deadline) = 0;
};

}  // namespace tandem::router_replay

#endif  // TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_ROUTE_SINK_H_
