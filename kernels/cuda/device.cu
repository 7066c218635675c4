#include <cuda_runtime.h>

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/launch.cuh"

namespace tandem::cuda {

int VisibleDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // Clear the sticky error so later calls start clean.
    return 0;
  }
  return count;
}

absl::StatusOr<DeviceInfo> SelectDevice(int ordinal) {
  const int count = VisibleDeviceCount();
  if (count == 0) return absl::FailedPreconditionError("no CUDA device is visible");
  if (ordinal < 0 || ordinal >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", ordinal, " requested but ", count, " visible"));
  }
  cudaDeviceProp properties;
  if (absl::Status status =
          CudaStatus(cudaGetDeviceProperties(&properties, ordinal), "cudaGetDeviceProperties");
      !status.ok()) {
    return status;
  }
  if (properties.major < 9) {
    return absl::UnimplementedError(absl::StrCat(
        "CUDA device ", ordinal, " (", properties.name, ") has compute capability ",
        properties.major, ".", properties.minor, "; Tandem's kernels need 9.0 or newer"));
  }
  if (absl::Status status = CudaStatus(cudaSetDevice(ordinal), "cudaSetDevice"); !status.ok()) {
    return status;
  }
  // DeviceMemory allocates from the device's stream-ordered pool; by default the pool hands
  // freed memory back to the driver at every synchronization, which would make each pass pay
  // for cudaMalloc again. Keep it.
  cudaMemPool_t pool;
  uint64_t keep_everything = UINT64_MAX;
  if (absl::Status status =
          CudaStatus(cudaDeviceGetDefaultMemPool(&pool, ordinal), "cudaDeviceGetDefaultMemPool");
      !status.ok()) {
    return status;
  }
  if (absl::Status status = CudaStatus(
          cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_everything),
          "cudaMemPoolSetAttribute");
      !status.ok()) {
    return status;
  }
  return DeviceInfo{.ordinal = ordinal,
                    .name = properties.name,
                    .compute_major = properties.major,
                    .compute_minor = properties.minor,
                    .total_bytes = static_cast<int64_t>(properties.totalGlobalMem),
                    .multiprocessors = properties.multiProcessorCount};
}

absl::Status UseDevice(int ordinal) { return CudaStatus(cudaSetDevice(ordinal), "cudaSetDevice"); }

absl::StatusOr<int> ParseCudaDevice(const std::string& device) {
  if (device == "cuda") return 0;
  int ordinal = 0;
  if (device.rfind("cuda:", 0) == 0 && absl::SimpleAtoi(device.substr(5), &ordinal) &&
      ordinal >= 0) {
    return ordinal;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device \"", device, "\" is not \"cuda\" or \"cuda:N\" with N >= 0"));
}

absl::Status Synchronize(Stream stream) {
  return CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

namespace {

// A start/stop pair of CUDA events, destroyed on every return path.
struct EventPair {
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  ~EventPair() {
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
  }
};

}  // namespace

absl::StatusOr<double> TimeMilliseconds(const std::function<absl::Status()>& launch, int iterations,
                                        int warmup, Stream stream) {
  for (int i = 0; i < warmup; ++i) {
    if (absl::Status status = launch(); !status.ok()) return status;
  }
  EventPair events;
  if (absl::Status status = CudaStatus(cudaEventCreate(&events.start), "cudaEventCreate");
      !status.ok()) {
    return status;
  }
  if (absl::Status status = CudaStatus(cudaEventCreate(&events.stop), "cudaEventCreate");
      !status.ok()) {
    return status;
  }
  cudaEventRecord(events.start, stream);
  for (int i = 0; i < iterations; ++i) {
    if (absl::Status status = launch(); !status.ok()) return status;
  }
  cudaEventRecord(events.stop, stream);
  if (absl::Status status = CudaStatus(cudaEventSynchronize(events.stop), "cudaEventSynchronize");
      !status.ok()) {
    return status;
  }
  float elapsed = 0.0f;
  if (absl::Status status =
          CudaStatus(cudaEventElapsedTime(&elapsed, events.start, events.stop), "timing");
      !status.ok()) {
    return status;
  }
  return static_cast<double>(elapsed) / iterations;
}

absl::StatusOr<DeviceMemory> DeviceMemory::Allocate(size_t bytes) {
  DeviceMemory memory;
  if (bytes == 0) return memory;
  // Stream-ordered on the default stream, which every kernel here uses: a pooled allocation
  // costs no driver call, and a free is ordered after the work queued before it.
  const cudaError_t error = cudaMallocAsync(&memory.data_, bytes, nullptr);
  if (error == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    return absl::ResourceExhaustedError(absl::StrCat("CUDA out of memory: asked for ", bytes,
                                                     " bytes, ", free_bytes, " of ", total_bytes,
                                                     " free"));
  }
  if (absl::Status status = CudaStatus(error, "cudaMallocAsync"); !status.ok()) return status;
  memory.bytes_ = bytes;
  return memory;
}

DeviceMemory& DeviceMemory::operator=(DeviceMemory&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFreeAsync(data_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

DeviceMemory::~DeviceMemory() {
  if (data_ != nullptr) cudaFreeAsync(data_, nullptr);
}

absl::Status CopyToDevice(void* device_destination, const void* host_source, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  return CudaStatus(cudaMemcpy(device_destination, host_source, bytes, cudaMemcpyHostToDevice),
                    "cudaMemcpy host to device");
}

absl::Status CopyToHost(void* host_destination, const void* device_source, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  return CudaStatus(cudaMemcpy(host_destination, device_source, bytes, cudaMemcpyDeviceToHost),
                    "cudaMemcpy device to host");
}

absl::Status CopyOnDevice(void* device_destination, const void* device_source, size_t bytes,
                          Stream stream) {
  if (bytes == 0) return absl::OkStatus();
  return CudaStatus(
      cudaMemcpyAsync(device_destination, device_source, bytes, cudaMemcpyDeviceToDevice, stream),
      "cudaMemcpyAsync device to device");
}

absl::Status ZeroDevice(void* device_destination, size_t bytes, Stream stream) {
  if (bytes == 0) return absl::OkStatus();
  return CudaStatus(cudaMemsetAsync(device_destination, 0, bytes, stream), "cudaMemsetAsync");
}

}  // namespace tandem::cuda
