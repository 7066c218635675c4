#ifndef TANDEM_KERNELS_CPU_GROUPED_LORA_H_
#define TANDEM_KERNELS_CPU_GROUPED_LORA_H_

#include <cstdint>

#include "kernels/types.h"

namespace tandem::cpu {

// For each group g (rows [offsets[g], offsets[g+1]) of x [N, in]): h = x_g . A_g^T ([rows, rank],
// saved in h [N, rank]); y_g += scale * h . B_g^T  (y [N, out]).
void GroupedLoraForward(const float* x, const int* offsets, int groups, int in, int out,
                        const kernels::GroupedLoraWeights& lora, float* h, float* y);

// Gradients: dh = scale * dy_g . B_g ; dB_g += scale * dy_g^T . h_g ; dA_g += dh_g^T . x_g ;
// dx_g += dh_g . A_g. da/db have the same layout and strides as lora.a/lora.b (shared tensors
// accumulate over groups). dx, da, db may be nullptr.
void GroupedLoraBackward(const float* x, const int* offsets, int groups, int in, int out,
                         const kernels::GroupedLoraWeights& lora, const float* h, const float* dy,
                         float* dx, float* da, float* db);

}  // namespace tandem::cpu

#endif  // TANDEM_KERNELS_CPU_GROUPED_LORA_H_
