#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/swiglu.h"

namespace tandem::cuda {
namespace {

// expf(-x) overflows to inf for x < -88, which still gives the right limit, 0.
__device__ inline float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__global__ void SwiGluKernel(const float* __restrict__ gate, const float* __restrict__ up,
                             float* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = gate[i];
    out[i] = g * Sigmoid(g) * up[i];
  }
}

// silu'(g) = σ(g) (1 + g (1 - σ(g))).
__global__ void SwiGluBackwardKernel(const float* __restrict__ gate, const float* __restrict__ up,
                                     const float* __restrict__ dout, float* __restrict__ dgate,
                                     float* __restrict__ dup, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = gate[i];
    const float s = Sigmoid(g);
    if (dgate != nullptr) dgate[i] += dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
    if (dup != nullptr) dup[i] += dout[i] * g * s;
  }
}

}  // namespace

absl::Status SwiGlu(const float* gate, const float* up, float* out, int64_t n, Stream stream) {
  if (n == 0) return absl::OkStatus();
  SwiGluKernel<<<GridFor(n), kThreadsPerBlock, 0, stream>>>(gate, up, out, n);
  return LaunchStatus("SwiGlu");
}

absl::Status SwiGluBackward(const float* gate, const float* up, const float* dout, float* dgate,
                            float* dup, int64_t n, Stream stream) {
  if (n == 0) return absl::OkStatus();
  SwiGluBackwardKernel<<<GridFor(n), kThreadsPerBlock, 0, stream>>>(gate, up, dout, dgate, dup, n);
  return LaunchStatus("SwiGluBackward");
}

}  // namespace tandem::cuda
