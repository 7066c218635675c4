#include <cuda_runtime.h>

#include "kernels/cuda/device.h"

namespace tandem::cuda {

int VisibleDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // Clear the sticky error so later calls start clean.
    return 0;
  }
  return count;
}

}  // namespace tandem::cuda
