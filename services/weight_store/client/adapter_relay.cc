#include "services/weight_store/client/adapter_relay.h"

#include <algorithm>
#include <iterator>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/logging.h"
#include "common/status.h"
#include "google/protobuf/util/message_differencer.h"

namespace tandem::weight_store {

void VersionChunks::Append(weightstore::v1::FetchTensorsResponse chunk) {
  absl::MutexLock lock(&mutex_);
  chunks_.push_back(std::move(chunk));
}

void VersionChunks::Finish(absl::Status status) {
  absl::MutexLock lock(&mutex_);
  if (!end_.has_value()) end_ = std::move(status);
}

absl::StatusOr<const weightstore::v1::FetchTensorsResponse*> VersionChunks::Wait(
    size_t index, absl::Time deadline) {
  absl::MutexLock lock(&mutex_);
  const auto arrived = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    return index < chunks_.size() || end_.has_value();
  };
  if (!mutex_.AwaitWithDeadline(absl::Condition(&arrived), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat("chunk ", index, " has not arrived"));
  }
  if (index < chunks_.size()) return &chunks_[index];
  if (!end_->ok()) return *end_;
  return nullptr;
}

std::shared_ptr<VersionChunks> RelayedVersions::Begin(const std::string& adapter, int64_t version) {
  auto chunks = std::make_shared<VersionChunks>();
  absl::MutexLock lock(&mutex_);
  versions_[{adapter, version}] = chunks;
  // Keeps the adapter's newest `keep_` versions: readers of older ones still hold theirs.
  auto first = versions_.lower_bound({adapter, 0});
  auto end = versions_.lower_bound({adapter + '\0', 0});
  for (int held = static_cast<int>(std::distance(first, end)); held > keep_; --held) {
    first = versions_.erase(first);
  }
  return chunks;
}

void RelayedVersions::Forget(const std::string& adapter, int64_t version,
                             const std::shared_ptr<VersionChunks>& chunks) {
  absl::MutexLock lock(&mutex_);
  if (auto held = versions_.find({adapter, version});
      held != versions_.end() && held->second == chunks) {
    versions_.erase(held);
  }
}

absl::StatusOr<std::shared_ptr<VersionChunks>> RelayedVersions::Await(const std::string& adapter,
                                                                      int64_t version,
                                                                      absl::Time deadline) {
  absl::MutexLock lock(&mutex_);
  // Begun, or passed over: a newer version of the adapter began here without it, so it will not.
  const auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    auto newest = versions_.lower_bound({adapter + '\0', 0});
    return versions_.contains({adapter, version}) ||
           (newest != versions_.begin() && std::prev(newest)->first.first == adapter &&
            std::prev(newest)->first.second > version);
  };
  if (!mutex_.AwaitWithDeadline(absl::Condition(&settled), deadline)) {
    return absl::DeadlineExceededError(
        absl::StrCat("this relay has not begun to receive ", adapter, "@", version));
  }
  if (auto held = versions_.find({adapter, version}); held != versions_.end()) return held->second;
  return absl::NotFoundError(absl::StrCat("this relay passed over ", adapter, "@", version));
}

grpc::Status AdapterRelayServiceImpl::Relay(
    grpc::ServerContext* context, const internal::v1::RelayRequest* request,
    grpc::ServerWriter<weightstore::v1::FetchTensorsResponse>* writer) {
  if (request->adapter_name().empty() || request->version() < 1) {
    return ToGrpcStatus(InvalidField(request->adapter_name().empty() ? "adapter_name" : "version",
                                     "adapter_name and a version >= 1 are required"));
  }
  if (!request->has_target()) {
    return ToGrpcStatus(InvalidField("target", "target is required: the reader's layout"));
  }
  if (!google::protobuf::util::MessageDifferencer::Equals(request->target(), versions_.layout())) {
    return ToGrpcStatus(absl::FailedPreconditionError(
        absl::StrCat("this relay holds versions in layout {", versions_.layout().ShortDebugString(),
                     "}, not {", request->target().ShortDebugString(), "}")));
  }
  // Waits in slices of the heartbeat, as for the chunks below: a reader that went away frees
  // this thread within one, and one that waits hears this relay is alive, so that its stall
  // watch measures the silence of a source, not this relay's wait for one.
  const auto heartbeat = [&] {
    return !context->IsCancelled() && writer->Write(weightstore::v1::FetchTensorsResponse());
  };
  const absl::Time waited = absl::Now() + wait_;
  absl::StatusOr<std::shared_ptr<VersionChunks>> chunks;
  while (true) {
    chunks = versions_.Await(request->adapter_name(), request->version(),
                             std::min(waited, absl::Now() + heartbeat_));
    if (!absl::IsDeadlineExceeded(chunks.status()) || absl::Now() >= waited) break;
    if (!heartbeat()) return grpc::Status::CANCELLED;
  }
  if (absl::IsDeadlineExceeded(chunks.status())) {
    return ToGrpcStatus(absl::NotFoundError(chunks.status().message()));
  }
  if (!chunks.ok()) return ToGrpcStatus(chunks.status());
  for (size_t index = 0;; ++index) {
    absl::StatusOr<const weightstore::v1::FetchTensorsResponse*> chunk;
    while (absl::IsDeadlineExceeded(
        (chunk = (*chunks)->Wait(index, absl::Now() + heartbeat_)).status())) {
      if (!heartbeat()) return grpc::Status::CANCELLED;
    }
    if (!chunk.ok()) return ToGrpcStatus(chunk.status());
    if (*chunk == nullptr) return grpc::Status::OK;
    if (!writer->Write(**chunk)) return grpc::Status::CANCELLED;
  }
}

namespace {

// The smallest chunks the store streams (FetchTensorsRequest.max_chunk_bytes).
constexpr uint32_t kStoreChunkBytes = 1 << 20;

// Records `chunk` in pieces of at most `piece_bytes`.
void AppendInPieces(const weightstore::v1::FetchTensorsResponse& chunk, size_t piece_bytes,
                    VersionChunks& chunks) {
  const std::string& data = chunk.data();
  for (size_t at = 0; at < data.size(); at += piece_bytes) {
    weightstore::v1::FetchTensorsResponse piece;
    if (at == 0 && chunk.has_tensor()) *piece.mutable_tensor() = chunk.tensor();
    piece.set_offset(chunk.offset() + at);
    piece.set_data(data.substr(at, piece_bytes));
    chunks.Append(std::move(piece));
  }
}

// Cancels a call that receives nothing for `stall`: a relay that stopped sending is given up
// well before the fetch's own deadline.
class StallWatch {
 public:
  StallWatch(grpc::ClientContext& context, absl::Duration stall)
      : last_progress_(absl::Now()), thread_([this, &context, stall] { Watch(context, stall); }) {}
  ~StallWatch() {
    {
      absl::MutexLock lock(&mutex_);
      done_ = true;
    }
    thread_.join();
  }

  void Progress() {
    absl::MutexLock lock(&mutex_);
    last_progress_ = absl::Now();
  }

 private:
  void Watch(grpc::ClientContext& context, absl::Duration stall) {
    absl::MutexLock lock(&mutex_);
    while (!mutex_.AwaitWithDeadline(absl::Condition(&done_), last_progress_ + stall)) {
      if (absl::Now() - last_progress_ >= stall) {
        context.TryCancel();
        return;
      }
    }
  }

  absl::Mutex mutex_;
  bool done_ ABSL_GUARDED_BY(mutex_) = false;
  absl::Time last_progress_ ABSL_GUARDED_BY(mutex_);
  std::thread thread_;  // Last: starts once the rest is set.
};

// Whether a failed try is followed by another (then this reader's own readers are told to ask
// again) or is the last.
enum class AfterFailure { kTryAgain, kGiveUp };

// One try: the stream `open` starts, every chunk recorded in a fresh VersionChunks as it
// arrives; given up after `stall` without a message (a chunk or a relay's heartbeat), when set.
template <typename Open>
absl::Status ReceiveRecording(RelayedVersions& versions, const std::string& adapter,
                              int64_t version, const RelayFetchOptions& options,
                              std::optional<absl::Duration> stall, AfterFailure after_failure,
                              const Open& open, FetchedAdapter& fetched) {
  grpc::ClientContext context;
  SetTimeout(context, options.timeout);
  std::optional<StallWatch> watch;
  if (stall.has_value()) watch.emplace(context, *stall);
  // Begun at the first chunk: readers downstream that wait for the version then read from a
  // try that moves bytes, not from one whose source refused it (they would give up with it).
  std::shared_ptr<VersionChunks> chunks;
  auto reader = open(context);
  const absl::Status received = ReceiveTensors(
      *reader, context, fetched, [&](const weightstore::v1::FetchTensorsResponse& chunk) {
        if (watch.has_value()) watch->Progress();
        if (IsHeartbeat(chunk)) return;
        if (chunks == nullptr) chunks = versions.Begin(adapter, version);
        AppendInPieces(chunk, std::max<uint32_t>(options.chunk_bytes, 1), *chunks);
      });
  if (chunks == nullptr) return received;
  if (received.ok() || after_failure == AfterFailure::kGiveUp) {
    chunks->Finish(received);
    return received;
  }
  // Forgotten first: a reader that asks again at once waits for the next try's chunks.
  versions.Forget(adapter, version, chunks);
  chunks->Finish(absl::AbortedError(absl::StrCat("this relay's read of ", adapter, "@", version,
                                                 " failed partway (", received.ToString(),
                                                 "); it reads the version again: ask again")));
  return received;
}

}  // namespace

absl::StatusOr<FetchedFrom> FetchRelaying(const WeightStoreStubs& store, RelayedVersions& versions,
                                          const std::string& adapter, int64_t version,
                                          const RelayFetchOptions& options,
                                          FetchedAdapter& fetched) {
  if (options.upstream != nullptr) {
    internal::v1::RelayRequest request;
    request.set_adapter_name(adapter);
    request.set_version(version);
    *request.mutable_target() = versions.layout();
    // Asked again once when it answers ABORTED: its own source failed partway (or went silent)
    // and it reads the version again, relaying that read.
    for (bool asked_again = false;; asked_again = true) {
      const absl::Status relayed = ReceiveRecording(
          versions, adapter, version, options, options.relay_stall, AfterFailure::kTryAgain,
          [&](grpc::ClientContext& context) { return options.upstream->Relay(&context, request); },
          fetched);
      if (relayed.ok()) return FetchedFrom::kRelay;
      if (absl::IsAborted(relayed) && !asked_again) {
        spdlog::info("relay of {}@{} read it again: asking again: {}", adapter, version,
                     relayed.ToString());
        continue;
      }
      // Whatever the relay's trouble, the store has the version.
      spdlog::warn("relay of {}@{} failed, reading from the store: {}", adapter, version,
                   relayed.ToString());
      break;
    }
  }
  weightstore::v1::FetchTensorsRequest request;
  request.set_adapter_name(adapter);
  request.set_version(version);
  *request.mutable_target() = versions.layout();
  request.set_max_chunk_bytes(kStoreChunkBytes);
  const absl::Status stored = ReceiveRecording(
      versions, adapter, version, options, std::nullopt, AfterFailure::kGiveUp,
      [&](grpc::ClientContext& context) { return store.api().FetchTensors(&context, request); },
      fetched);
  if (!stored.ok()) return stored;
  return FetchedFrom::kStore;
}

}  // namespace tandem::weight_store
