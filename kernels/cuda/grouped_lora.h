#ifndef TANDEM_KERNELS_CUDA_GROUPED_LORA_H_
#define TANDEM_KERNELS_CUDA_GROUPED_LORA_H_

#include "absl/status/status.h"
#include "kernels/cuda/device.h"
#include "kernels/types.h"

namespace tandem::cuda {

// Device twins of kernels/cpu/grouped_lora.h: the same math, weights (kernels::GroupedLoraWeights
// holding device pointers) and per-group strides, so all three expert layouts are covered.
// Offsets are in device memory; max_rows >= offsets[groups] sizes the launches. The shrink
// (x · Aᵀ) and expand (h · Bᵀ) are segmented per group by the grouped GEMM kernels; a shared
// A or B is one GEMM over all rows. Call them as cuda::GroupedLoraForward(...): the cpu::
// argument type makes lookup find the CPU twins too.
absl::Status GroupedLoraForward(const float* x, const int* offsets, int groups, int max_rows,
                                int in, int out, const kernels::GroupedLoraWeights& lora, float* h,
                                float* y, Stream stream = nullptr);

// dh_workspace holds max_rows · rank floats.
absl::Status GroupedLoraBackward(const float* x, const int* offsets, int groups, int max_rows,
                                 int in, int out, const kernels::GroupedLoraWeights& lora,
                                 const float* h, const float* dy, float* dx, float* da, float* db,
                                 float* dh_workspace, Stream stream = nullptr);

}  // namespace tandem::cuda

#endif  // TANDEM_KERNELS_CUDA_GROUPED_LORA_H_
