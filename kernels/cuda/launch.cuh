#ifndef TANDEM_KERNELS_CUDA_LAUNCH_CUH_
#define TANDEM_KERNELS_CUDA_LAUNCH_CUH_

// Shared by the .cu files of this package only: error conversion, grid sizing and the block-wide
// reductions every row kernel uses.

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::cuda {

inline absl::Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // Clear a non-sticky error so the next call starts clean.
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

// The status of the kernel launched last on this thread (bad configuration, no device, ...).
// Errors raised while the kernel runs surface at the next Synchronize or copy.
inline absl::Status LaunchStatus(const char* kernel) {
  return CudaStatus(cudaGetLastError(), kernel);
}

constexpr int kThreadsPerBlock = 256;

// Blocks for a grid-stride loop over n elements: enough to fill the GPU, never zero.
inline unsigned GridFor(int64_t n, int threads = kThreadsPerBlock) {
  const int64_t wanted = (n + threads - 1) / threads;
  constexpr int64_t kMaxBlocks = 65535;
  return static_cast<unsigned>(wanted < 1 ? 1 : (wanted < kMaxBlocks ? wanted : kMaxBlocks));
}

// Blocks for one thread per element (kernels without a grid-stride loop); gridDim.x allows
// 2^31 - 1 blocks, far beyond any count of tokens here.
inline unsigned OneThreadEach(int64_t n, int threads = kThreadsPerBlock) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

__device__ inline float WarpSum(float value) {
  for (int offset = 16; offset > 0; offset /= 2)
    value += __shfl_xor_sync(0xffffffff, value, offset);
  return value;
}

__device__ inline float WarpMax(float value) {
  for (int offset = 16; offset > 0; offset /= 2) {
    value = fmaxf(value, __shfl_xor_sync(0xffffffff, value, offset));
  }
  return value;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` holds 32 floats of shared memory; the call may be repeated with the same scratch.
__device__ inline float BlockSum(float value, float* scratch) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  value = WarpSum(value);
  __syncthreads();  // A previous call's readers are done with scratch.
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  const int warps = blockDim.x / 32;
  value = lane < warps ? scratch[lane] : 0.0f;
  return WarpSum(value);
}

__device__ inline float BlockMax(float value, float* scratch) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  value = WarpMax(value);
  __syncthreads();
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  const int warps = blockDim.x / 32;
  value = lane < warps ? scratch[lane] : -INFINITY;
  return WarpMax(value);
}

}  // namespace tandem::cuda

#endif  // TANDEM_KERNELS_CUDA_LAUNCH_CUH_
