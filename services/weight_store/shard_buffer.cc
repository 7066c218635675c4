#include "services/weight_store/shard_buffer.h"

#include <new>

#include "absl/strings/str_cat.h"

namespace tandem::weight_store {

absl::StatusOr<std::unique_ptr<ShardBuffer>> ShardBuffer::Allocate(transfer::UcxWorker* ucx,
                                                                   size_t length) {
  std::unique_ptr<ShardBuffer> buffer(new ShardBuffer());
  buffer->length_ = length;
  if (ucx != nullptr) {
    absl::StatusOr<std::unique_ptr<transfer::UcxRegion>> region = ucx->Allocate(length);
    if (!region.ok()) return region.status();
    buffer->region_ = *std::move(region);
    buffer->data_ = buffer->region_->data();
  } else {
    buffer->plain_.reset(new (std::nothrow) char[length]);
    if (buffer->plain_ == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", length, " bytes of memory for a shard"));
    }
    buffer->data_ = buffer->plain_.get();
  }
  return buffer;
}

absl::StatusOr<std::unique_ptr<ShardBuffer>> ShardBufferPool::Take(size_t length) {
  {
    absl::MutexLock lock(&mutex_);
    if (auto found = by_length_.find(length); found != by_length_.end()) {
      std::unique_ptr<ShardBuffer> buffer = std::move(*found->second);
      kept_.erase(found->second);
      by_length_.erase(found);
      kept_bytes_ -= length;
      return buffer;
    }
  }
  return ShardBuffer::Allocate(ucx_, length);
}

void ShardBufferPool::Give(std::unique_ptr<ShardBuffer> buffer) {
  const size_t length = buffer->length();
  if (length > max_bytes_) return;
  Kept freed;  // Freed (unmapped) once the lock is released.
  absl::MutexLock lock(&mutex_);
  while (kept_bytes_ + length > max_bytes_) {
    // The oldest buffer is the first of its length: both orders are the order given.
    const auto oldest = by_length_.lower_bound(kept_.front()->length());
    kept_bytes_ -= kept_.front()->length();
    freed.splice(freed.end(), kept_, kept_.begin());
    by_length_.erase(oldest);
  }
  kept_bytes_ += length;
  kept_.push_back(std::move(buffer));
  by_length_.emplace(length, std::prev(kept_.end()));
}

}  // namespace tandem::weight_store
