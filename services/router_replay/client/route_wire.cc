#include "services/router_replay/client/route_wire.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::router_replay {

absl::Status ValidateShape(const RouteShape& shape) {
  if (shape.layers.empty() || shape.layers.size() > kMaxLayers) {
    return InvalidField("moe_layer_indices",
                        absl::StrCat("moe_layer_indices has ", shape.layers.size(),
                                     " entries; allowed 1..", kMaxLayers));
  }
  for (size_t i = 0; i < shape.layers.size(); ++i) {
    if (shape.layers[i] < 0 || (i > 0 && shape.layers[i] <= shape.layers[i - 1])) {
      return InvalidField(
          IndexPath("moe_layer_indices", static_cast<int64_t>(i)),
          absl::StrCat("moe_layer_indices must be strictly increasing global layer indices >= 0; "
                       "entry ",
                       i, " is ", shape.layers[i]));
    }
  }
  if (shape.top_k < 1 || shape.top_k > kMaxTopK) {
    return InvalidField("top_k", absl::StrCat("top_k is ", shape.top_k, "; allowed 1..", kMaxTopK));
  }
  if (shape.num_experts < shape.top_k || shape.num_experts > kMaxExperts) {
    return InvalidField("num_experts", absl::StrCat("num_experts is ", shape.num_experts,
                                                    "; allowed top_k..", kMaxExperts));
  }
  return absl::OkStatus();
}

RecordKey FromProto(const type::v1::RouteRecordKey& key) {
  return {.job_id = key.job_id(),
          .policy_version = key.policy_version(),
          .sample_id = key.sample_id(),
          .attempt = key.attempt()};
}

type::v1::RouteRecordKey ToProto(const RecordKey& key) {
  type::v1::RouteRecordKey proto;
  proto.set_job_id(key.job_id);
  proto.set_policy_version(key.policy_version);
  proto.set_sample_id(key.sample_id);
  proto.set_attempt(key.attempt);
  return proto;
}

routerreplay::v1::AppendRequest AppendRequestFor(const RecordKey& key, const RouteShape& shape,
                                                 int64_t first_row, int64_t num_rows,
                                                 const int16_t* rows, bool seal) {
  routerreplay::v1::AppendRequest request;
  *request.mutable_key() = ToProto(key);
  request.mutable_moe_layer_indices()->Add(shape.layers.begin(), shape.layers.end());
  request.set_top_k(shape.top_k);
  request.set_num_experts(shape.num_experts);
  request.set_token_offset(first_row);
  request.set_num_tokens(static_cast<int32_t>(num_rows));
  request.set_rows(reinterpret_cast<const char*>(rows),
                   num_rows * shape.ids_per_row() * sizeof(int16_t));
  request.set_seal(seal);
  return request;
}

}  // namespace tandem::router_replay
