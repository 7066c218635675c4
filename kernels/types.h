#ifndef TANDEM_KERNELS_TYPES_H_
#define TANDEM_KERNELS_TYPES_H_

#include <cmath>
#include <cstdint>

// The types every backend's kernels (kernels/cpu, kernels/cuda) and the engine's operations share:
// what an operation is asked to compute, independent of where it computes.

namespace tandem::kernels {

// Heads and widths of an attention: H query heads of qk_dim, KV key/value heads (KV divides H)
// whose keys are qk_dim and values v_dim wide, and the scale of the scores. Standard attention
// has qk_dim = v_dim = D and scale 1/sqrt(D); DeepSeek's latent attention has wider queries and
// keys than values and a scale of its own.
struct AttentionShape {
  int heads = 1;
  int kv_heads = 1;
  int qk_dim = 1;
  int v_dim = 1;
  float scale = 1.0f;

  static AttentionShape Standard(int heads, int kv_heads, int head_dim) {
    return {.heads = heads,
            .kv_heads = kv_heads,
            .qk_dim = head_dim,
            .v_dim = head_dim,
            .scale = 1.0f / std::sqrt(static_cast<float>(head_dim))};
  }
};

// How a router turns logits into scores: softmax over a row, or sigmoid of each logit.
enum class ScoringFunction { kSoftmax, kSigmoid };

// DeepSeek-V3's group-limited routing (transformers' DeepseekV3TopkRouter): the E experts form
// `groups` equal groups of at least two; a group scores the sum of its two best selection keys;
// only the `kept_groups` best groups keep their keys, the others' keys become 0 (a masked_fill
// with 0.0, not -inf: a kept expert whose key is below 0 loses to a masked one, as there).
// groups = 1 limits nothing.
struct GroupLimit {
  int groups = 1;
  int kept_groups = 1;
};

// LoRA applied to row groups (the experts of an MoE layer after permutation, or one group for a
// dense projection). The expert layouts (docs/engine.md) are all expressed by per-group strides:
//   per_expert:              a_group_stride = rank*in, b_group_stride = out*rank
//   shared:                  both strides 0
//   shared_outer, gate/up:   a_group_stride = 0,       b_group_stride = out*rank
//   shared_outer, down:      a_group_stride = rank*in, b_group_stride = 0
// The base projection is not part of these kernels; they add only the adapter's contribution.
struct GroupedLoraWeights {
  const float* a;          // [.., rank, in]
  const float* b;          // [.., out, rank]
  int64_t a_group_stride;  // floats between consecutive groups' A; 0 = one A shared by all groups
  int64_t b_group_stride;  // likewise for B
  int rank;
  float scale;  // alpha / rank, applied here exactly once
};

}  // namespace tandem::kernels

#endif  // TANDEM_KERNELS_TYPES_H_
