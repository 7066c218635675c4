#ifndef TANDEM_ENGINE_CUDA_STAGED_VALUES_H_
#define TANDEM_ENGINE_CUDA_STAGED_VALUES_H_

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/device.h"

namespace tandem::engine::cuda {

// Small host arrays that kernels read from device memory (group offsets, cache addresses,
// positions), kept on the device by content: values asked for again, as every projection of a
// pass asks for the same group offsets and every decode step for the same cache addresses, cost
// no copy. A copy from pageable host memory waits for the device's queue to drain, so copying
// each time would serialize the host's launches with the device's work.
//
// The copy that replaces an entry's values waits for the work queued before it (a synchronous
// copy on the stream the kernels run on), so a kernel still reading the old values is never
// overwritten. Not thread-safe.
template <typename T>
class StagedValues {
 public:
  explicit StagedValues(size_t capacity) : capacity_(capacity) {}

  // The device copy of `host` (at least one value), valid until `capacity` other arrays have
  // been staged since it was last asked for.
  absl::StatusOr<T*> Get(const std::vector<T>& host) {
    ++clock_;
    for (Entry& entry : entries_) {
      if (entry.host == host) {
        entry.last_used = clock_;
        return entry.device.data();
      }
    }
    Entry& entry = entries_.size() < capacity_ ? entries_.emplace_back() : LeastRecentlyUsed();
    if (entry.device.size() < host.size()) {
      absl::StatusOr<::tandem::cuda::DeviceArray<T>> grown =
          ::tandem::cuda::DeviceArray<T>::Zeros(host.size());
      if (!grown.ok()) return grown.status();
      entry.device = *std::move(grown);
    }
    entry.host.clear();  // A failed copy leaves the entry matching nothing.
    if (absl::Status status =
            ::tandem::cuda::CopyToDevice(entry.device.data(), host.data(), host.size() * sizeof(T));
        !status.ok()) {
      return status;
    }
    entry.host = host;
    entry.last_used = clock_;
    return entry.device.data();
  }

 private:
  struct Entry {
    std::vector<T> host;
    ::tandem::cuda::DeviceArray<T> device;
    uint64_t last_used = 0;
  };

  Entry& LeastRecentlyUsed() {
    return *std::min_element(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) {
      return a.last_used < b.last_used;
    });
  }

  const size_t capacity_;
  std::vector<Entry> entries_;
  uint64_t clock_ = 0;
};

}  // namespace tandem::engine::cuda

#endif  // TANDEM_ENGINE_CUDA_STAGED_VALUES_H_
