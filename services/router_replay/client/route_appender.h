#ifndef TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_ROUTE_APPENDER_H_
#define TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_ROUTE_APPENDER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "services/router_replay/client/record_key.h"
#include "services/router_replay/client/route_sink.h"
#include "services/router_replay/client/route_wire.h"
#include "tandem/routerreplay/v1/router_replay.grpc.pb.h"

namespace tandem::router_replay {

struct RouteAppenderOptions {
  // Rows queued or in flight, as int16 bytes. Append blocks while the buffer is full.
  int64_t max_buffered_bytes = int64_t{64} << 20;
  // How long Append may block on a full buffer before it gives up with RESOURCE_EXHAUSTED,
  // so a slow or absent router-replay never stalls decode for long.
  absl::Duration max_block = absl::Milliseconds(200);
  // Row bytes per Append stream (one batch); chunks of a record are merged within a batch.
  int64_t max_batch_bytes = int64_t{4} << 20;
  // Append streams in flight at once. A record always goes to the same stream, so its chunks
  // stay in order; more streams overlap one batch's fsync with the next batch's transfer.
  int streams = 2;
  absl::Duration rpc_timeout = absl::Seconds(30);
  // Attempts per batch when router-replay is UNAVAILABLE (or the deadline passes); identical
  // re-appends are no-ops, so resending is safe.
  int max_attempts = 5;
  absl::Duration initial_backoff = absl::Milliseconds(50);
};

// Rollout's side of router-replay: queues route rows from the decode loop and sends them on a
// background thread in batched client streams, so decode never waits on the network. Records
// that fail are reported by WaitForRecord, never dropped silently. Thread-safe.
class RouteAppender final : public RouteSink {
 public:
  RouteAppender(std::shared_ptr<grpc::Channel> channel, RouteAppenderOptions options = {});
  ~RouteAppender() override;  // Sends what is queued (with the usual retries), then stops.

  // RouteSink; Append is RESOURCE_EXHAUSTED when the buffer stayed full for max_block.
  absl::Status Append(const RecordKey& key, const RouteShape& shape, int64_t first_row,
                      int64_t num_rows, const int16_t* rows, bool seal) override;
  absl::Status WaitForRecord(const RecordKey& key, absl::Time deadline) override;

  // Waits until everything queued so far is durable; returns the first record error, if any.
  absl::Status Flush(absl::Time deadline);

  int64_t buffered_bytes() const;

 private:
  struct Chunk {
    std::string record;  // Encoded key.
    routerreplay::v1::AppendRequest request;
    int64_t bytes = 0;  // Row bytes.
    int64_t parts = 1;  // Chunks queued by Append that were merged into this one.
  };
  struct RecordState {
    int64_t pending_chunks = 0;
    absl::Status status;
  };

  void SendLoop(int stream);
  std::vector<Chunk> TakeBatch(int stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Sends a batch with retries; returns the status for each record in it.
  absl::flat_hash_map<std::string, absl::Status> Send(const std::vector<Chunk>& batch);
  // One Append stream of `chunks`, retried while router-replay is unreachable.
  grpc::Status SendOnce(const std::vector<const Chunk*>& chunks);
  void Complete(const std::vector<Chunk>& batch,
                const absl::flat_hash_map<std::string, absl::Status>& results);

  const std::unique_ptr<routerreplay::v1::RouterReplayService::Stub> stub_;
  const RouteAppenderOptions options_;
  mutable absl::Mutex mutex_;
  std::vector<std::deque<Chunk>> queues_ ABSL_GUARDED_BY(mutex_);  // One per stream.
  int64_t queued_chunks_ ABSL_GUARDED_BY(mutex_) = 0;
  absl::flat_hash_map<std::string, RecordState> records_ ABSL_GUARDED_BY(mutex_);
  int64_t buffered_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t in_flight_ ABSL_GUARDED_BY(mutex_) = 0;
  absl::Status first_error_ ABSL_GUARDED_BY(mutex_);
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::vector<std::thread> senders_;
};

}  // namespace tandem::router_replay

#endif  // TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_ROUTE_APPENDER_H_
