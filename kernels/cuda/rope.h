#ifndef TANDEM_KERNELS_CUDA_ROPE_H_
#define TANDEM_KERNELS_CUDA_ROPE_H_

#include "absl/status/statusor.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/device.h"

namespace tandem::cuda {

// cpu::RopeFrequencies in device memory (inverse frequencies stay double, as on the CPU, so the
// angles of long positions keep their precision).
struct DeviceRopeFrequencies {
  DeviceArray<double> inv_freq;
  double scale = 1.0;

  static absl::StatusOr<DeviceRopeFrequencies> Upload(const cpu::RopeFrequencies& rope);
  int head_dim() const { return 2 * static_cast<int>(inv_freq.size()); }
};

// Device twins of cpu::Rope / cpu::RopeBackward: rotate x [tokens, heads, head_dim] in place by
// each token's position (positions in device memory); the backward rotates by the negated angle.
absl::Status Rope(float* x, const int* positions, int tokens, int heads,
                  const DeviceRopeFrequencies& rope, Stream stream = nullptr);
absl::Status RopeBackward(float* dx, const int* positions, int tokens, int heads,
                          const DeviceRopeFrequencies& rope, Stream stream = nullptr);

}  // namespace tandem::cuda

#endif  // TANDEM_KERNELS_CUDA_ROPE_H_
