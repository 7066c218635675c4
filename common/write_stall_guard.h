#ifndef TANDEM_COMMON_WRITE_STALL_GUARD_H_
#define TANDEM_COMMON_WRITE_STALL_GUARD_H_

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/periodic_thread.h"
#include "grpcpp/server_context.h"

namespace tandem {

// Cancels server streams whose client stopped reading: a write pending for longer than
// `timeout` means the client's flow-control window stayed full, and the stream would otherwise
// hold its message and its slot until the client's own deadline, which may be never. The
// stream's reactor then sees its write fail and finishes. Thread-safe.
class WriteStallGuard {
 public:
  WriteStallGuard(std::string stream_name, absl::Duration timeout)
      : stream_name_(std::move(stream_name)),
        timeout_(timeout),
        checker_(timeout / 4, [this] { CancelStalled(absl::Now()); }) {}

  // A reactor calls these around each write and once it is done (OnDone); `context` must stay
  // valid until Remove.
  void WriteStarted(grpc::CallbackServerContext* context) {
    absl::MutexLock lock(&mutex_);
    pending_[context] = absl::Now();
  }
  void WriteDone(grpc::CallbackServerContext* context) {
    absl::MutexLock lock(&mutex_);
    pending_.erase(context);
  }
  void Remove(grpc::CallbackServerContext* context) { WriteDone(context); }

 private:
  void CancelStalled(absl::Time now) {
    absl::MutexLock lock(&mutex_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (now - it->second < timeout_) {
        ++it;
        continue;
      }
      spdlog::warn("{}: cancelling the stream to {}: its client read nothing for {}", stream_name_,
                   it->first->peer(), absl::FormatDuration(now - it->second));
      it->first->TryCancel();  // Under the lock: Remove (from OnDone) cannot run meanwhile.
      pending_.erase(it++);
    }
  }

  const std::string stream_name_;
  const absl::Duration timeout_;
  absl::Mutex mutex_;
  absl::flat_hash_map<grpc::CallbackServerContext*, absl::Time> pending_ ABSL_GUARDED_BY(mutex_);
  PeriodicThread checker_;  // Last: stops before the map it reads goes.
};

}  // namespace tandem

#endif  // TANDEM_COMMON_WRITE_STALL_GUARD_H_
