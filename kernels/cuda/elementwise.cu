#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/launch.cuh"

namespace tandem::cuda {
namespace {

__global__ void AddKernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] += x[i];
  }
}

__global__ void ScaleKernel(float* __restrict__ y, float factor, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] *= factor;
  }
}

// common/dtype.h's ToBFloat16 and back, on the bits.
__global__ void RoundToBf16Kernel(float* __restrict__ x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint32_t bits = __float_as_uint(x[i]);
    uint32_t rounded;
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
      rounded = (bits | 0x00400000u) & 0xffff0000u;  // Quiet NaN, payload's top bits kept.
    } else {
      rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
    }
    x[i] = __uint_as_float(rounded);
  }
}

}  // namespace

absl::Status RoundToBf16(float* x, int64_t n, Stream stream) {
  if (n == 0) return absl::OkStatus();
  RoundToBf16Kernel<<<GridFor(n), kThreadsPerBlock, 0, stream>>>(x, n);
  return LaunchStatus("RoundToBf16");
}

absl::Status AddInPlace(const float* x, float* y, int64_t n, Stream stream) {
  if (n == 0) return absl::OkStatus();
  AddKernel<<<GridFor(n), kThreadsPerBlock, 0, stream>>>(x, y, n);
  return LaunchStatus("AddInPlace");
}

absl::Status ScaleInPlace(float* y, float factor, int64_t n, Stream stream) {
  if (n == 0) return absl::OkStatus();
  ScaleKernel<<<GridFor(n), kThreadsPerBlock, 0, stream>>>(y, factor, n);
  return LaunchStatus("ScaleInPlace");
}

}  // namespace tandem::cuda
