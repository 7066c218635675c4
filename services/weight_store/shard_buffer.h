#ifndef TANDEM_SERVICES_WEIGHT_STORE_SHARD_BUFFER_H_
#define TANDEM_SERVICES_WEIGHT_STORE_SHARD_BUFFER_H_

#include <cstddef>
#include <list>
#include <map>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "transfer/ucx_transport.h"

namespace tandem::weight_store {

// Memory holding one shard. With a UCX worker it is registered, so producers can put into it
// and consumers get from it without the store touching the bytes; plain memory otherwise.
class ShardBuffer {
 public:
  static absl::StatusOr<std::unique_ptr<ShardBuffer>> Allocate(transfer::UcxWorker* ucx,
                                                               size_t length);

  char* data() const { return data_; }
  size_t length() const { return length_; }
  absl::string_view bytes() const { return {data_, length_}; }
  // Null without UCX.
  const transfer::UcxRegion* region() const { return region_.get(); }

 private:
  ShardBuffer() = default;

  std::unique_ptr<transfer::UcxRegion> region_;
  std::unique_ptr<char[]> plain_;
  char* data_ = nullptr;
  size_t length_ = 0;
};

// The shard buffers of retired versions, kept for the next uploads of the same sizes: a stream
// of versions of one adapter (each the size of the last) then maps and faults in no fresh
// memory, which on these machines costs more than moving the bytes (a 974 MiB upload into fresh
// memory was announced 0.69 s after its publish began, against 0.19 s into kept memory). Holds
// at most max_bytes, the buffers given last: sizes no longer published (an adapter that
// changed, one no longer trained) give way to those that are. Thread-safe.
class ShardBufferPool {
 public:
  ShardBufferPool(transfer::UcxWorker* ucx, size_t max_bytes) : ucx_(ucx), max_bytes_(max_bytes) {}

  // A kept buffer of exactly `length` bytes, else a new one.
  absl::StatusOr<std::unique_ptr<ShardBuffer>> Take(size_t length);
  // Keeps `buffer`, freeing the buffers given longest ago as far as it needs room; frees
  // `buffer` instead if it alone is larger than max_bytes.
  void Give(std::unique_ptr<ShardBuffer> buffer);

 private:
  using Kept = std::list<std::unique_ptr<ShardBuffer>>;

  transfer::UcxWorker* const ucx_;
  const size_t max_bytes_;
  absl::Mutex mutex_;
  Kept kept_ ABSL_GUARDED_BY(mutex_);  // Given longest ago first.
  // Into kept_ by length; of one length, in the order given.
  std::multimap<size_t, Kept::iterator> by_length_ ABSL_GUARDED_BY(mutex_);
  size_t kept_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace tandem::weight_store

#endif  // TANDEM_SERVICES_WEIGHT_STORE_SHARD_BUFFER_H_
