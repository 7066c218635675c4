#ifndef TANDEM_KERNELS_CPU_ATTENTION_H_
#define TANDEM_KERNELS_CPU_ATTENTION_H_

namespace tandem::cpu {

// Multi-head causal self-attention with scale 1/sqrt(D); every head has its own keys and values
// (no grouped-query sharing). Layouts are token-major, [T, H, D], as the QKV projection writes
// them.

// One sequence: q,k,v [T, H, D] (already roped) -> out [T, H, D]; probs [H, T, T] saved (row t
// holds softmax over keys 0..t, zeros after).
void CausalAttention(const float* q, const float* k, const float* v, float* out, float* probs,
                     int T, int H, int D);

// Accumulates into dq, dk, dv [T, H, D] (any may be nullptr) given dout and the probs saved by
// CausalAttention.
void CausalAttentionBackward(const float* q, const float* k, const float* v, const float* probs,
                             const float* dout, float* dq, float* dk, float* dv, int T, int H,
                             int D);

// Decode: one new query q [H, D] attends to cached keys/values k_cache, v_cache [len, H, D] (len
// includes the new token, whose k/v the caller already appended); out [H, D]; scratch has room
// for len floats; len >= 1. Matches row len-1 of CausalAttention over the same keys to float
// rounding (the softmax code is shared; the dot products go through BLAS in both).
void DecodeAttention(const float* q, const float* k_cache, const float* v_cache, int len,
                     float* out, int H, int D, float* scratch);

}  // namespace tandem::cpu

#endif  // TANDEM_KERNELS_CPU_ATTENTION_H_
