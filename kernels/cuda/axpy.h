#ifndef TANDEM_KERNELS_CUDA_AXPY_H_
#define TANDEM_KERNELS_CUDA_AXPY_H_

#include <cstdint>
#include <string>

namespace tandem::cuda {

// y <- a * x + y for n floats in host memory, computed on GPU 0. Returns an empty string on
// success, else the CUDA error. The first kernel of the project: it proves the nvcc build path
// and the skip-without-GPU test pattern that every CUDA kernel follows.
std::string Axpy(float a, const float* x, float* y, int64_t n);

}  // namespace tandem::cuda

#endif  // TANDEM_KERNELS_CUDA_AXPY_H_
