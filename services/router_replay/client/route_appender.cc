#include "services/router_replay/client/route_appender.h"

#include <algorithm>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/status.h"
#include "services/router_replay/client/route_wire.h"

namespace tandem::router_replay {
namespace {

constexpr int64_t kMaxChunkRowBytes = int64_t{4} << 20;

// Worth retrying the same stream: the server restarts, is slow, or its disk is full (it resumes
// on its own once there is space).
bool IsTransient(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED ||
         code == grpc::StatusCode::RESOURCE_EXHAUSTED;
}

// Appends `next` to `into` when it continues it: same record, contiguous rows, not yet sealed.
bool Merge(routerreplay::v1::AppendRequest& into, const routerreplay::v1::AppendRequest& next) {
  if (into.seal() || next.token_offset() != into.token_offset() + into.num_tokens() ||
      static_cast<int64_t>(into.rows().size() + next.rows().size()) > kMaxChunkRowBytes) {
    return false;
  }
  into.set_num_tokens(into.num_tokens() + next.num_tokens());
  into.mutable_rows()->append(next.rows());
  into.set_seal(next.seal());
  return true;
}

}  // namespace

RouteAppender::RouteAppender(std::shared_ptr<grpc::Channel> channel, RouteAppenderOptions options)
    : stub_(routerreplay::v1::RouterReplayService::NewStub(std::move(channel))),
      options_(options),
      queues_(std::max(1, options.streams)) {
  for (int stream = 0; stream < static_cast<int>(queues_.size()); ++stream) {
    senders_.emplace_back([this, stream] { SendLoop(stream); });
  }
}

RouteAppender::~RouteAppender() {
  {
    absl::MutexLock lock(&mutex_);
    stopping_ = true;
  }
  for (std::thread& sender : senders_) sender.join();
}

absl::Status RouteAppender::Append(const RecordKey& key, const RouteShape& shape, int64_t first_row,
                                   int64_t num_rows, const int16_t* rows, bool seal) {
  if (absl::Status status = ValidateRecordKey(key); !status.ok()) return status;
  if (absl::Status status = ValidateShape(shape); !status.ok()) return status;
  const int64_t bytes = num_rows * shape.ids_per_row() * static_cast<int64_t>(sizeof(int16_t));
  if (first_row < 0 || num_rows < 1 || bytes > kMaxChunkRowBytes) {
    // Named as the AppendRequest field each argument becomes.
    const char* field = first_row < 0 ? "token_offset" : num_rows < 1 ? "num_tokens" : "rows";
    return InvalidField(field, absl::StrCat("record ", ToString(key), ": rows [", first_row, ", +",
                                            num_rows, ") need first_row >= 0, 1 row, <= 4 MiB"));
  }
  Chunk chunk{.record = EncodeRecordKey(key),
              .request = AppendRequestFor(key, shape, first_row, num_rows, rows, seal),
              .bytes = bytes};
  absl::MutexLock lock(&mutex_);
  if (auto it = records_.find(chunk.record); it != records_.end() && !it->second.status.ok()) {
    return it->second.status;
  }
  const auto has_room = [this, bytes]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    return buffered_bytes_ == 0 || buffered_bytes_ + bytes <= options_.max_buffered_bytes;
  };
  if (!mutex_.AwaitWithTimeout(absl::Condition(&has_room), options_.max_block)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "route buffer full (", buffered_bytes_, " bytes) for ",
        absl::FormatDuration(options_.max_block), "; router-replay is not keeping up"));
  }
  buffered_bytes_ += bytes;
  ++records_[chunk.record].pending_chunks;
  const size_t stream = absl::Hash<std::string>{}(chunk.record) % queues_.size();
  queues_[stream].push_back(std::move(chunk));
  ++queued_chunks_;
  return absl::OkStatus();
}

std::vector<RouteAppender::Chunk> RouteAppender::TakeBatch(int stream) {
  std::deque<Chunk>& queue = queues_[stream];
  std::vector<Chunk> batch;
  absl::flat_hash_map<std::string, size_t> last_of_record;
  int64_t batch_bytes = 0;
  while (!queue.empty() && batch_bytes < options_.max_batch_bytes) {
    Chunk chunk = std::move(queue.front());
    queue.pop_front();
    --queued_chunks_;
    batch_bytes += chunk.bytes;
    // Decode appends one row per record and step; merging makes them one chunk per record.
    if (auto it = last_of_record.find(chunk.record);
        it != last_of_record.end() && Merge(batch[it->second].request, chunk.request)) {
      batch[it->second].bytes += chunk.bytes;
      batch[it->second].parts += chunk.parts;
      continue;
    }
    last_of_record[chunk.record] = batch.size();
    batch.push_back(std::move(chunk));
  }
  return batch;
}

void RouteAppender::SendLoop(int stream) {
  while (true) {
    std::vector<Chunk> batch;
    {
      absl::MutexLock lock(&mutex_);
      const auto has_work = [this, stream]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
        return !queues_[stream].empty() || stopping_;
      };
      mutex_.Await(absl::Condition(&has_work));
      if (queues_[stream].empty()) return;  // Stopping, and everything was sent.
      batch = TakeBatch(stream);
      in_flight_ += static_cast<int64_t>(batch.size());
    }
    const absl::flat_hash_map<std::string, absl::Status> results = Send(batch);
    absl::MutexLock lock(&mutex_);
    Complete(batch, results);
    in_flight_ -= static_cast<int64_t>(batch.size());
  }
}

grpc::Status RouteAppender::SendOnce(const std::vector<const Chunk*>& chunks) {
  grpc::Status status;
  absl::Duration backoff = options_.initial_backoff;
  for (int attempt = 1;; ++attempt) {
    grpc::ClientContext context;
    SetTimeout(context, options_.rpc_timeout);
    routerreplay::v1::AppendResponse response;
    std::unique_ptr<grpc::ClientWriter<routerreplay::v1::AppendRequest>> writer =
        stub_->Append(&context, &response);
    for (const Chunk* chunk : chunks) {
      if (!writer->Write(chunk->request)) break;  // The server ended the stream; Finish says why.
    }
    writer->WritesDone();
    status = writer->Finish();
    if (status.ok() || !IsTransient(status.error_code()) || attempt >= options_.max_attempts) {
      return status;
    }
    absl::SleepFor(backoff);
    backoff *= 2;
  }
}

absl::flat_hash_map<std::string, absl::Status> RouteAppender::Send(
    const std::vector<Chunk>& batch) {
  absl::flat_hash_map<std::string, absl::Status> results;
  std::vector<const Chunk*> all;
  for (const Chunk& chunk : batch) all.push_back(&chunk);
  const grpc::Status status = SendOnce(all);
  if (status.ok() || IsTransient(status.error_code())) {
    for (const Chunk& chunk : batch) results[chunk.record] = FromGrpcStatus(status);
    return results;
  }
  // One record's bad chunk failed the stream: resend record by record (chunks stored before
  // the failure are identical re-appends, so no-ops) to tell which records failed.
  absl::flat_hash_map<std::string, std::vector<const Chunk*>> by_record;
  for (const Chunk& chunk : batch) by_record[chunk.record].push_back(&chunk);
  for (const auto& [record, chunks] : by_record) results[record] = FromGrpcStatus(SendOnce(chunks));
  return results;
}

void RouteAppender::Complete(const std::vector<Chunk>& batch,
                             const absl::flat_hash_map<std::string, absl::Status>& results) {
  for (const Chunk& chunk : batch) {
    buffered_bytes_ -= chunk.bytes;
    RecordState& state = records_[chunk.record];
    state.pending_chunks -= chunk.parts;
    const absl::Status& result = results.at(chunk.record);
    if (!result.ok() && state.status.ok()) {
      state.status = result;
      if (first_error_.ok()) first_error_ = result;
    }
    // Records that ended well need no state; failed ones keep their error for the caller.
    if (state.pending_chunks == 0 && state.status.ok()) records_.erase(chunk.record);
  }
}

absl::Status RouteAppender::WaitForRecord(const RecordKey& key, absl::Time deadline) {
  const std::string record = EncodeRecordKey(key);
  absl::MutexLock lock(&mutex_);
  const auto settled = [this, &record]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    auto it = records_.find(record);
    return it == records_.end() || it->second.pending_chunks == 0;
  };
  if (!mutex_.AwaitWithDeadline(absl::Condition(&settled), deadline)) {
    return absl::DeadlineExceededError(
        absl::StrCat("routes of record ", ToString(key), " not yet durable"));
  }
  auto it = records_.find(record);
  return it == records_.end() ? absl::OkStatus() : it->second.status;
}

absl::Status RouteAppender::Flush(absl::Time deadline) {
  absl::MutexLock lock(&mutex_);
  const auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    return queued_chunks_ == 0 && in_flight_ == 0;
  };
  if (!mutex_.AwaitWithDeadline(absl::Condition(&drained), deadline)) {
    return absl::DeadlineExceededError(
        absl::StrCat("routes not yet durable: ", buffered_bytes_, " bytes pending"));
  }
  return first_error_;
}

int64_t RouteAppender::buffered_bytes() const {
  absl::MutexLock lock(&mutex_);
  return buffered_bytes_;
}

}  // namespace tandem::router_replay
