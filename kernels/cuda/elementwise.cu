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

}  // namespace

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
