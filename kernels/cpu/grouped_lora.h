#ifndef TANDEM_KERNELS_CPU_GROUPED_LORA_H_
#define TANDEM_KERNELS_CPU_GROUPED_LORA_H_

#include <cstdint>

// LoRA applied to row groups (the experts of an MoE layer after permutation, or one group for a
// dense projection). The DESIGN.md expert layouts are all expressed by per-group strides:
//   per_expert:              a_group_stride = rank*in, b_group_stride = out*rank
//   shared:                  both strides 0
//   shared_outer, gate/up:   a_group_stride = 0,       b_group_stride = out*rank
//   shared_outer, down:      a_group_stride = rank*in, b_group_stride = 0
// The base projection is not part of these kernels; they add only the adapter's contribution.

namespace tandem::cpu {

struct GroupedLoraWeights {
  const float* a;          // [.., rank, in]
  const float* b;          // [.., out, rank]
  int64_t a_group_stride;  // floats between consecutive groups' A; 0 = one A shared by all groups
  int64_t b_group_stride;  // likewise for B
  int rank;
  float scale;  // alpha / rank, applied here exactly once
};

// For each group g (rows [offsets[g], offsets[g+1]) of x [N, in]): h = x_g . A_g^T ([rows, rank],
// saved in h [N, rank]); y_g += scale * h . B_g^T  (y [N, out]).
void GroupedLoraForward(const float* x, const int* offsets, int groups, int in, int out,
                        const GroupedLoraWeights& lora, float* h, float* y);

// Gradients: dh = scale * dy_g . B_g ; dB_g += scale * dy_g^T . h_g ; dA_g += dh_g^T . x_g ;
// dx_g += dh_g . A_g. da/db have the same layout and strides as lora.a/lora.b (shared tensors
// accumulate over groups). dx, da, db may be nullptr.
void GroupedLoraBackward(const float* x, const int* offsets, int groups, int in, int out,
                         const GroupedLoraWeights& lora, const float* h, const float* dy, float* dx,
                         float* da, float* db);

}  // namespace tandem::cpu

#endif  // TANDEM_KERNELS_CPU_GROUPED_LORA_H_
