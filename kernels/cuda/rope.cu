#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/rope.h"

namespace tandem::cuda {
namespace {

// One thread per (token, head, pair i): rotates (x_i, x_{i+half}), the CPU's pairing.
__global__ void RopeKernel(float* __restrict__ x, const int* __restrict__ positions, int tokens,
                           int heads, const double* __restrict__ inv_freq, int half, double scale,
                           double sign) {
  const int64_t pairs = int64_t{tokens} * heads * half;
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < pairs;
       p += int64_t{gridDim.x} * blockDim.x) {
    const int i = static_cast<int>(p % half);
    const int64_t vector = p / half;  // token * heads + head
    const int token = static_cast<int>(vector / heads);
    double sin_angle, cos_angle;
    sincos(positions[token] * inv_freq[i], &sin_angle, &cos_angle);
    const float c = static_cast<float>(scale * cos_angle);
    const float s = static_cast<float>(scale * sign * sin_angle);
    float* v = x + vector * 2 * half;
    const float a = v[i];
    const float b = v[i + half];
    v[i] = a * c - b * s;
    v[i + half] = b * c + a * s;
  }
}

absl::Status Rotate(float* x, const int* positions, int tokens, int heads,
                    const DeviceRopeFrequencies& rope, double sign, Stream stream) {
  const int half = static_cast<int>(rope.inv_freq.size());
  const int64_t pairs = int64_t{tokens} * heads * half;
  if (pairs == 0) return absl::OkStatus();
  RopeKernel<<<GridFor(pairs), kThreadsPerBlock, 0, stream>>>(
      x, positions, tokens, heads, rope.inv_freq.data(), half, rope.scale, sign);
  return LaunchStatus(sign > 0 ? "Rope" : "RopeBackward");
}

}  // namespace

absl::StatusOr<DeviceRopeFrequencies> DeviceRopeFrequencies::Upload(
    const cpu::RopeFrequencies& rope) {
  absl::StatusOr<DeviceArray<double>> inv_freq = DeviceArray<double>::FromHost(rope.inv_freq);
  if (!inv_freq.ok()) return inv_freq.status();
  return DeviceRopeFrequencies{.inv_freq = *std::move(inv_freq), .scale = rope.scale};
}

absl::Status Rope(float* x, const int* positions, int tokens, int heads,
                  const DeviceRopeFrequencies& rope, Stream stream) {
  return Rotate(x, positions, tokens, heads, rope, 1.0, stream);
}

// The rotation is orthogonal: the gradient of scale·R·x is scale·Rᵀ·dy.
absl::Status RopeBackward(float* dx, const int* positions, int tokens, int heads,
                          const DeviceRopeFrequencies& rope, Stream stream) {
  return Rotate(dx, positions, tokens, heads, rope, -1.0, stream);
}

}  // namespace tandem::cuda
