#include <cuda_runtime.h>

#include "kernels/cuda/axpy.h"

namespace tandem::cuda {
namespace {

__global__ void AxpyKernel(float a, const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    y[i] = fmaf(a, x[i], y[i]);
  }
}

// Frees device buffers on every return path.
struct DeviceBuffers {
  float* x = nullptr;
  float* y = nullptr;
  ~DeviceBuffers() {
    cudaFree(x);
    cudaFree(y);
  }
};

}  // namespace

std::string Axpy(float a, const float* x, float* y, int64_t n) {
  if (n == 0) return "";
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  DeviceBuffers device;
  cudaError_t err = cudaMalloc(&device.x, bytes);
  if (err == cudaSuccess) err = cudaMalloc(&device.y, bytes);
  if (err == cudaSuccess) err = cudaMemcpy(device.x, x, bytes, cudaMemcpyHostToDevice);
  if (err == cudaSuccess) err = cudaMemcpy(device.y, y, bytes, cudaMemcpyHostToDevice);
  if (err == cudaSuccess) {
    constexpr int kThreads = 256;
    const int64_t wanted_blocks = (n + kThreads - 1) / kThreads;
    const int blocks = static_cast<int>(wanted_blocks < 65535 ? wanted_blocks : 65535);
    AxpyKernel<<<blocks, kThreads>>>(a, device.x, device.y, n);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) err = cudaMemcpy(y, device.y, bytes, cudaMemcpyDeviceToHost);
  return err == cudaSuccess ? "" : cudaGetErrorString(err);
}

}  // namespace tandem::cuda
