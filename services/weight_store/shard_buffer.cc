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
    if (auto found = kept_.find(length); found != kept_.end()) {
      std::unique_ptr<ShardBuffer> buffer = std::move(found->second);
      kept_.erase(found);
      kept_bytes_ -= length;
      return buffer;
    }
  }
  return ShardBuffer::Allocate(ucx_, length);
}

void ShardBufferPool::Give(std::unique_ptr<ShardBuffer> buffer) {
  absl::MutexLock lock(&mutex_);
  if (kept_bytes_ + buffer->length() > max_bytes_) return;
  kept_bytes_ += buffer->length();
  kept_.emplace(buffer->length(), std::move(buffer));
}

}  // namespace tandem::weight_store
