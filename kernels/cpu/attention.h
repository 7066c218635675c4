#ifndef TANDEM_KERNELS_CPU_ATTENTION_H_
#define TANDEM_KERNELS_CPU_ATTENTION_H_

#include "kernels/types.h"

namespace tandem::cpu {

// The same three operations for any kernels::AttentionShape: q [T, H, qk_dim], k [T, KV, qk_dim],
// v [T, KV, v_dim], out [T, H, v_dim].
void CausalAttention(const float* q, const float* k, const float* v, float* out, float* probs,
                     int T, const kernels::AttentionShape& shape);
void CausalAttentionBackward(const float* q, const float* k, const float* v, const float* probs,
                             const float* dout, float* dq, float* dk, float* dv, int T,
                             const kernels::AttentionShape& shape);
void DecodeAttention(const float* q, const float* k_cache, const float* v_cache, int len,
                     float* out, const kernels::AttentionShape& shape, float* scratch);

// Multi-head causal self-attention with scale 1/sqrt(D) and grouped-query sharing: H query heads,
// KV key/value heads (KV divides H), query head h reading key/value head h / (H / KV); KV = H
// is plain multi-head attention. Layouts are token-major, q [T, H, D] and k, v [T, KV, D], as
// the projections write them.

// One sequence: q, k, v (already roped) -> out [T, H, D]; probs [H, T, T] saved (row t holds
// softmax over keys 0..t, zeros after).
void CausalAttention(const float* q, const float* k, const float* v, float* out, float* probs,
                     int T, int H, int KV, int D);

// Accumulates into dq [T, H, D], dk and dv [T, KV, D] (any may be nullptr) given dout and the
// probs saved by CausalAttention; a shared key/value head sums the gradients of its group.
void CausalAttentionBackward(const float* q, const float* k, const float* v, const float* probs,
                             const float* dout, float* dq, float* dk, float* dv, int T, int H,
                             int KV, int D);

// Decode: one new query q [H, D] attends to cached keys/values k_cache, v_cache [len, KV, D]
// (len includes the new token, whose k/v the caller already appended); out [H, D]; scratch has
// room for len floats; len >= 1. Matches row len-1 of CausalAttention over the same keys to
// float rounding (the softmax code is shared; the dot products go through BLAS in both).
void DecodeAttention(const float* q, const float* k_cache, const float* v_cache, int len,
                     float* out, int H, int KV, int D, float* scratch);

}  // namespace tandem::cpu

#endif  // TANDEM_KERNELS_CPU_ATTENTION_H_
