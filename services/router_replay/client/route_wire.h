#ifndef TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_ROUTE_WIRE_H_
#define TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_ROUTE_WIRE_H_

// Route records on the wire: the shape of a record's rows and the conversions between
// router_replay.proto messages and the record key, shared by the server and its clients.
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "services/router_replay/client/record_key.h"
#include "tandem/routerreplay/v1/router_replay.pb.h"

namespace tandem::router_replay {

// What every row of a record looks like: per MoE layer (named by global index) top_k logical
// expert ids in selection order. Rows are [layers, top_k] int16; -1 marks a missing (row, layer).
struct RouteShape {
  std::vector<int32_t> layers;
  int32_t top_k = 0;
  int32_t num_experts = 0;

  int64_t ids_per_row() const { return static_cast<int64_t>(layers.size()) * top_k; }
  friend bool operator==(const RouteShape&, const RouteShape&) = default;
};

inline constexpr int kMaxLayers = 1024;
inline constexpr int kMaxTopK = 64;
inline constexpr int kMaxExperts = 32767;

// INVALID_ARGUMENT unless layers are 1..1024 strictly increasing indices >= 0, top_k is 1..64
// and num_experts is top_k..32767, naming the AppendRequest field (moe_layer_indices[i], top_k,
// num_experts).
absl::Status ValidateShape(const RouteShape& shape);

RecordKey FromProto(const type::v1::RouteRecordKey& key);
type::v1::RouteRecordKey ToProto(const RecordKey& key);

// The Append chunk carrying rows [first_row, first_row + num_rows) of a record,
// [num_rows, layers, top_k].
routerreplay::v1::AppendRequest AppendRequestFor(const RecordKey& key, const RouteShape& shape,
                                                 int64_t first_row, int64_t num_rows,
                                                 const int16_t* rows, bool seal);

}  // namespace tandem::router_replay

#endif  // TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_ROUTE_WIRE_H_
