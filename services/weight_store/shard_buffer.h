#ifndef TANDEM_SERVICES_WEIGHT_STORE_SHARD_BUFFER_H_
#define TANDEM_SERVICES_WEIGHT_STORE_SHARD_BUFFER_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "transfer/ucx_transport.h"

namespace tandem::weight_store {

// Memory holding one shard. With a UCX worker it is registered, so producers can put into it
// and consumers get from it without the store touching the bytes; plain memory otherwise.
class ShardBuffer {
 public:
  static absl::StatusOr<std::unique_ptr<ShardBuffer>> Allocate(transfer::UcxWorker* ucx, size_t length);

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

}  // namespace tandem::weight_store

#endif  // TANDEM_SERVICES_WEIGHT_STORE_SHARD_BUFFER_H_
