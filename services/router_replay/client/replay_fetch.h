#ifndef TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_REPLAY_FETCH_H_
#define TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_REPLAY_FETCH_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "services/router_replay/client/record_key.h"
#include "tandem/routerreplay/v1/router_replay.grpc.pb.h"

namespace tandem::router_replay {

// One sequence of a packed training batch and the record its routes were captured under.
struct ReplaySequence {
  RecordKey key;
  int64_t num_tokens = 0;  // The record holds num_tokens - 1 rows.
};

struct ReplayFetchOptions {
  // MoE layers the engine replays, as global indices in its order; top_k and num_experts of
  // its config. Records must match.
  std::vector<int32_t> moe_layers;
  int32_t top_k = 0;
  int32_t num_experts = 0;
  // Missing or unsealed records, and records deleted during the fetch, become -1 rows (the
  // engine then routes live) instead of an error.
  bool allow_partial = false;
  absl::Duration timeout = absl::Seconds(60);
};

// Routes in the engine's replay layout, [sum of num_tokens, moe layers, top_k]: each sequence's
// rows at its offset in the batch, its last token (never fed back) and any missing row -1.
struct ReplayRoutes {
  std::vector<int16_t> routes;
  std::vector<routerreplay::v1::RecordStatus> statuses;  // Per sequence.
  // (row, layer) entries that came back -1, not counting the last tokens.
  int64_t missing_entries = 0;
};

// Fetches the routes of a training batch from router-replay straight into the array
// Transformer::Forward replays.
absl::StatusOr<ReplayRoutes> FetchReplayRoutes(
    routerreplay::v1::RouterReplayService::StubInterface& stub,
    absl::Span<const ReplaySequence> sequences, const ReplayFetchOptions& options);

}  // namespace tandem::router_replay

#endif  // TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_REPLAY_FETCH_H_
