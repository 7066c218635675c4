#ifndef TANDEM_KERNELS_CUDA_TESTING_H_
#define TANDEM_KERNELS_CUDA_TESTING_H_

// What every CUDA kernel test shares: skip without a GPU, random inputs, host<->device moves
// that fail the test (not the process) on a CUDA error, and elementwise comparison.

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device.h"

namespace tandem::cuda {

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (VisibleDeviceCount() == 0) GTEST_SKIP() << "no GPU visible; CUDA kernel not run";
    const absl::StatusOr<DeviceInfo> device = SelectDevice(0);
    ASSERT_TRUE(device.ok()) << device.status();
  }
};

// Uniform values in [low, high), reproducible from `seed`.
std::vector<float> RandomFloats(size_t n, uint32_t seed, float low = -1.0f, float high = 1.0f);
// Uniform integers in [0, bound), reproducible from `seed`.
std::vector<int> RandomInts(size_t n, uint32_t seed, int bound);

// Device copy of `host`; a CUDA error ends the test binary with the error printed, since a test
// cannot go on without its inputs (gtest's ASSERT cannot return a value).
template <typename T>
DeviceArray<T> Upload(const std::vector<T>& host) {
  absl::StatusOr<DeviceArray<T>> array = DeviceArray<T>::FromHost(host);
  if (!array.ok()) {
    std::cerr << "upload of " << host.size() << " elements failed: " << array.status() << "\n";
    std::abort();
  }
  return *std::move(array);
}

template <typename T>
DeviceArray<T> DeviceZeros(size_t size) {
  absl::StatusOr<DeviceArray<T>> array = DeviceArray<T>::Zeros(size);
  if (!array.ok()) {
    std::cerr << "allocation of " << size << " elements failed: " << array.status() << "\n";
    std::abort();
  }
  return *std::move(array);
}

// Host copy of `array` after everything queued on the default stream has finished.
template <typename T>
std::vector<T> Download(const DeviceArray<T>& array) {
  absl::StatusOr<std::vector<T>> host = array.ToHost();
  EXPECT_TRUE(host.ok()) << host.status();
  return host.ok() ? *std::move(host) : std::vector<T>(array.size());
}

// Every |actual - expected| <= abs_tolerance + rel_tolerance * |expected|; reports the first
// few mismatches with their index.
void ExpectAllNear(const std::vector<float>& actual, const std::vector<float>& expected,
                   float abs_tolerance, float rel_tolerance = 0.0f);

}  // namespace tandem::cuda

#endif  // TANDEM_KERNELS_CUDA_TESTING_H_
