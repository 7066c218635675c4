#ifndef TANDEM_SERVICES_WEIGHT_STORE_CLIENT_SHARD_ORDER_H_
#define TANDEM_SERVICES_WEIGHT_STORE_CLIENT_SHARD_ORDER_H_

#include <cstdint>
#include <utility>

#include "absl/container/btree_map.h"
#include "absl/functional/function_ref.h"

namespace tandem::weight_store {

// Puts the blocks of one shard, offered in another order (a read plan's, tensor by tensor), back
// in the shard's byte order, so that the shard's checksum can be taken over bytes that arrive
// scattered: a block is passed on once every byte before it was, and a block offered ahead of
// that is held (its address: its bytes stay where they are) until then. Plans that read shards
// whole read each tensor's slice of a shard in order, and producers lay the slices out in about
// the order of the tensors: a few blocks are held at a time, still in cache when passed on.
class InShardOrder {
 public:
  using Next = absl::FunctionRef<void(const char* bytes, uint64_t length)>;

  // Offers shard bytes [offset, offset + length), held at `bytes` until passed on. Calls `next`
  // for each block, this one or held ones, that comes next in shard order. False once some byte
  // was offered twice (nothing is passed on then).
  bool Offer(uint64_t offset, const char* bytes, uint64_t length, Next next);

  // Whether bytes [0, length) were offered, each once.
  bool Complete(uint64_t length) const {
    return !overlapped_ && held_.empty() && passed_ == length;
  }

 private:
  bool overlapped_ = false;
  uint64_t passed_ = 0;  // Bytes [0, passed_) were passed on.
  absl::btree_map<uint64_t, std::pair<const char*, uint64_t>> held_;  // By offset.
};

}  // namespace tandem::weight_store

#endif  // TANDEM_SERVICES_WEIGHT_STORE_CLIENT_SHARD_ORDER_H_
