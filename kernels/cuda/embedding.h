#ifndef TANDEM_KERNELS_CUDA_EMBEDDING_H_
#define TANDEM_KERNELS_CUDA_EMBEDDING_H_

#include "absl/status/status.h"
#include "kernels/cuda/device.h"

namespace tandem::cuda {

// Device twins of kernels/cpu/embedding.h; ids must be in [0, vocab). The backward adds with
// atomics, so rows sharing an id sum in an unspecified order (equal to the CPU's up to rounding).
absl::Status EmbeddingGather(const float* table, const int* ids, float* out, int rows, int dim,
                             Stream stream = nullptr);
absl::Status EmbeddingBackward(const float* dout, const int* ids, float* dtable, int rows, int dim,
                               Stream stream = nullptr);

}  // namespace tandem::cuda

#endif  // TANDEM_KERNELS_CUDA_EMBEDDING_H_
