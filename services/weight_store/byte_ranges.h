#ifndef TANDEM_SERVICES_WEIGHT_STORE_BYTE_RANGES_H_
#define TANDEM_SERVICES_WEIGHT_STORE_BYTE_RANGES_H_

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>

namespace tandem::weight_store {

// The set of distinct bytes written to a buffer, as merged [begin, end) ranges, so rewrites
// and retried chunks are counted once.
class ByteRanges {
 public:
  void Add(uint64_t begin, uint64_t end) {
    auto it = ranges_.upper_bound(begin);
    if (it != ranges_.begin() && std::prev(it)->second >= begin) {
      --it;
      begin = it->first;
    }
    while (it != ranges_.end() && it->first <= end) {
      end = std::max(end, it->second);
      total_ -= it->second - it->first;
      it = ranges_.erase(it);
    }
    ranges_[begin] = end;
    total_ += end - begin;
  }

  uint64_t total() const { return total_; }

 private:
  std::map<uint64_t, uint64_t> ranges_;  // begin -> end, disjoint and non-adjacent.
  uint64_t total_ = 0;
};

}  // namespace tandem::weight_store

#endif  // TANDEM_SERVICES_WEIGHT_STORE_BYTE_RANGES_H_
