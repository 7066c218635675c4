#ifndef TANDEM_KERNELS_CUDA_DEVICE_H_
#define TANDEM_KERNELS_CUDA_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Host-side view of the CUDA runtime: callers (engine, services, tests) need no CUDA headers.
// Kernels in this package take device pointers and a Stream, enqueue their work and return the
// launch status; results are read back with CopyToHost, which synchronizes.

struct CUstream_st;  // cudaStream_t is `CUstream_st*`; forward-declared to keep CUDA out.

namespace tandem::cuda {

using Stream = CUstream_st*;  // nullptr is the default stream.

// Number of usable GPUs. Without a GPU the runtime reports an error (for example
// "driver version is insufficient") rather than zero devices, so any error counts as none.
int VisibleDeviceCount();

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int compute_major = 0;
  int compute_minor = 0;
  int64_t total_bytes = 0;
  int multiprocessors = 0;
};

// Makes GPU `ordinal` current for the calling thread. FAILED_PRECONDITION when no GPU is visible
// or the ordinal is out of range; UNIMPLEMENTED below compute capability 9.0 (the kernels are
// built for Hopper: sm_90 code and compute_90 PTX, which newer GPUs JIT-compile).
absl::StatusOr<DeviceInfo> SelectDevice(int ordinal);

// Makes GPU `ordinal` (already checked by SelectDevice) current for the calling thread: CUDA's
// current device is per thread, and engines are called from threads other than their creator's.
absl::Status UseDevice(int ordinal);

// Parses "cuda" or "cuda:N" (the --device flag's GPU forms) into an ordinal; INVALID_ARGUMENT
// otherwise.
absl::StatusOr<int> ParseCudaDevice(const std::string& device);

// Waits for all work queued on `stream`; returns the first error any of it raised.
absl::Status Synchronize(Stream stream = nullptr);

// Mean milliseconds per call of `launch` (which enqueues work on `stream`) over `iterations`
// calls, timed with CUDA events after `warmup` untimed calls; the first failing launch's status
// otherwise. For benchmarks.
absl::StatusOr<double> TimeMilliseconds(const std::function<absl::Status()>& launch, int iterations,
                                        int warmup = 3, Stream stream = nullptr);

// Owning, move-only device allocation, from the device's stream-ordered pool on the default
// stream (cudaMallocAsync / cudaFreeAsync): memory comes back to the pool when the work queued
// before the free is done, and the pool keeps it (SelectDevice sets that up).
class DeviceMemory {
 public:
  DeviceMemory() = default;
  // RESOURCE_EXHAUSTED naming the size asked and the device's free memory when it does not fit.
  static absl::StatusOr<DeviceMemory> Allocate(size_t bytes);
  DeviceMemory(DeviceMemory&& other) noexcept { *this = std::move(other); }
  DeviceMemory& operator=(DeviceMemory&& other) noexcept;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory();

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Synchronous copies; `bytes` must not exceed either side.
absl::Status CopyToDevice(void* device_destination, const void* host_source, size_t bytes);
absl::Status CopyToHost(void* host_destination, const void* device_source, size_t bytes);
// Asynchronous device-to-device copy on `stream`.
absl::Status CopyOnDevice(void* device_destination, const void* device_source, size_t bytes,
                          Stream stream = nullptr);
// Zero-fills `bytes` of device memory.
absl::Status ZeroDevice(void* device_destination, size_t bytes, Stream stream = nullptr);

// A typed DeviceMemory of `size()` elements of T.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  static absl::StatusOr<DeviceArray> Zeros(size_t size) {
    absl::StatusOr<DeviceMemory> memory = DeviceMemory::Allocate(size * sizeof(T));
    if (!memory.ok()) return memory.status();
    DeviceArray array(*std::move(memory), size);
    if (absl::Status zeroed = ZeroDevice(array.data(), size * sizeof(T)); !zeroed.ok()) {
      return zeroed;
    }
    return array;
  }
  static absl::StatusOr<DeviceArray> FromHost(const std::vector<T>& host) {
    absl::StatusOr<DeviceMemory> memory = DeviceMemory::Allocate(host.size() * sizeof(T));
    if (!memory.ok()) return memory.status();
    DeviceArray array(*std::move(memory), host.size());
    if (absl::Status copied = CopyToDevice(array.data(), host.data(), host.size() * sizeof(T));
        !copied.ok()) {
      return copied;
    }
    return array;
  }
  absl::StatusOr<std::vector<T>> ToHost() const {
    std::vector<T> host(size_);
    if (absl::Status copied = CopyToHost(host.data(), data(), size_ * sizeof(T)); !copied.ok()) {
      return copied;
    }
    return host;
  }

  T* data() const { return static_cast<T*>(memory_.data()); }
  size_t size() const { return size_; }

 private:
  DeviceArray(DeviceMemory memory, size_t size) : memory_(std::move(memory)), size_(size) {}

  DeviceMemory memory_;
  size_t size_ = 0;
};

}  // namespace tandem::cuda

#endif  // TANDEM_KERNELS_CUDA_DEVICE_H_
