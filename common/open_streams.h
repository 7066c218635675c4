#ifndef TANDEM_COMMON_OPEN_STREAMS_H_
#define TANDEM_COMMON_OPEN_STREAMS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "common/queued_write_reactor.h"

namespace tandem {

// A service's long-lived server streams (watches), so its drain can end them at once with a
// status that tells clients to reconnect, instead of holding the server for its whole drain
// timeout (every rollout replica keeps a weight-store watch open). Thread-safe.
template <typename Response>
class OpenStreams {
 public:
  using Sink = typename QueuedWriteReactor<Response>::Sink;

  // Registers an open stream and returns its id; a stream opened after EndAll ends at once.
  int64_t Add(std::shared_ptr<Sink> sink) {
    std::optional<grpc::Status> ended;
    {
      absl::MutexLock lock(&mutex_);
      if (!ended_.has_value()) {
        const int64_t id = next_id_++;
        streams_.emplace(id, std::move(sink));
        return id;
      }
      ended = ended_;
    }
    sink->Finish(*ended);  // Outside the lock, as in EndAll.
    return 0;
  }

  // Forgets a stream (it ended); unknown ids are ignored.
  void Remove(int64_t id) {
    absl::MutexLock lock(&mutex_);
    streams_.erase(id);
  }

  // Ends every open stream, and every one opened later, with `status`.
  void EndAll(const grpc::Status& status) {
    std::map<int64_t, std::shared_ptr<Sink>> streams;
    {
      absl::MutexLock lock(&mutex_);
      ended_ = status;
      streams.swap(streams_);
    }
    for (auto& [id, sink] : streams) sink->Finish(status);  // Outside the lock: takes the sink's.
  }

 private:
  absl::Mutex mutex_;
  std::map<int64_t, std::shared_ptr<Sink>> streams_ ABSL_GUARDED_BY(mutex_);
  int64_t next_id_ ABSL_GUARDED_BY(mutex_) = 1;
  std::optional<grpc::Status> ended_ ABSL_GUARDED_BY(mutex_);
};

// The status a draining server ends its watch streams with: UNAVAILABLE, which clients treat as
// "reconnect" (to another replica, or to this one after its restart).
inline grpc::Status DrainingStatus(const char* service) {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      std::string(service) + " is shutting down; watch again");
}

}  // namespace tandem

#endif  // TANDEM_COMMON_OPEN_STREAMS_H_
