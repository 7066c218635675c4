#include "services/weight_store/client/shard_order.h"

namespace tandem::weight_store {

bool InShardOrder::Offer(uint64_t offset, const char* bytes, uint64_t length, Next next) {
  if (overlapped_) return false;
  if (offset != passed_) {
    // Behind what was passed on, or where another held block starts: a byte offered twice.
    overlapped_ = offset < passed_ || !held_.try_emplace(offset, bytes, length).second;
    return !overlapped_;
  }
  next(bytes, length);
  passed_ += length;
  while (!held_.empty() && held_.begin()->first <= passed_) {
    const auto [held_offset, block] = *held_.begin();
    if (held_offset < passed_) {
      overlapped_ = true;
      return false;
    }
    next(block.first, block.second);
    passed_ += block.second;
    held_.erase(held_.begin());
  }
  return true;
}

}  // namespace tandem::weight_store
