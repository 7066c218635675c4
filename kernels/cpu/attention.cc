#include "kernels/cpu/attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/gemm.h"

namespace tandem::cpu {
namespace {

// Shared by the full-sequence and the decode path so that both normalize identically; the
// model's KV-cache-equals-full-forward test rests on it. Only the BLAS dot products then differ
// between the paths (by rounding, ~5e-7 on O(1) inputs).
void SoftmaxInPlace(float* x, int n) {
  float max = x[0];
  for (int j = 1; j < n; ++j) max = std::max(max, x[j]);
  double sum = 0.0;
  for (int j = 0; j < n; ++j) {
    x[j] = std::exp(x[j] - max);
    sum += x[j];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int j = 0; j < n; ++j) x[j] *= inv;
}

// Turns the raw scores of one head, [T, T], into causal probabilities in place.
void CausalSoftmax(float* scores, int T) {
  for (int t = 0; t < T; ++t) {
    float* row = scores + static_cast<int64_t>(t) * T;
    SoftmaxInPlace(row, t + 1);
    std::fill(row + t + 1, row + T, 0.0f);
  }
}

// dS = P ∘ (dP - rowsum(P ∘ dP)), the softmax backward, written over dp. Entries above the
// diagonal are set to zero explicitly rather than trusting 0 · dP (dP may be huge there).
void SoftmaxBackwardInPlace(const float* p, float* dp, int T) {
  for (int t = 0; t < T; ++t) {
    const float* prow = p + static_cast<int64_t>(t) * T;
    float* drow = dp + static_cast<int64_t>(t) * T;
    double dot = 0.0;
    for (int j = 0; j <= t; ++j) dot += static_cast<double>(prow[j]) * drow[j];
    const float dotf = static_cast<float>(dot);
    for (int j = 0; j <= t; ++j) drow[j] = prow[j] * (drow[j] - dotf);
    std::fill(drow + t + 1, drow + T, 0.0f);
  }
}

}  // namespace

// Per head, q is a [T, Dqk] view with row stride H*Dqk, k and v views with row strides KV*Dqk
// and KV*Dv, so each head is two strided GEMMs.
void CausalAttention(const float* q, const float* k, const float* v, float* out, float* probs,
                     int T, const kernels::AttentionShape& s) {
  const int ld_q = s.heads * s.qk_dim, ld_k = s.kv_heads * s.qk_dim;
  const int ld_v = s.kv_heads * s.v_dim, ld_out = s.heads * s.v_dim;
  const int group = s.heads / s.kv_heads;
  for (int h = 0; h < s.heads; ++h) {
    const int kv = h / group;
    float* p = probs + static_cast<int64_t>(h) * T * T;
    Gemm(false, true, T, T, s.qk_dim, s.scale, q + h * s.qk_dim, ld_q, k + kv * s.qk_dim, ld_k,
         0.0f, p, T);
    CausalSoftmax(p, T);
    Gemm(false, false, T, s.v_dim, T, 1.0f, p, T, v + kv * s.v_dim, ld_v, 0.0f,
         out + h * s.v_dim, ld_out);
  }
}

void CausalAttentionBackward(const float* q, const float* k, const float* v, const float* probs,
                             const float* dout, float* dq, float* dk, float* dv, int T,
                             const kernels::AttentionShape& s) {
  const int ld_q = s.heads * s.qk_dim, ld_k = s.kv_heads * s.qk_dim;
  const int ld_v = s.kv_heads * s.v_dim, ld_out = s.heads * s.v_dim;
  const int group = s.heads / s.kv_heads;
  const bool need_scores_grad = dq != nullptr || dk != nullptr;
  std::vector<float> ds(need_scores_grad ? static_cast<size_t>(T) * T : 0);
  for (int h = 0; h < s.heads; ++h) {
    const int kv = h / group;
    const float* p = probs + static_cast<int64_t>(h) * T * T;
    const float* dout_h = dout + h * s.v_dim;
    if (dv != nullptr) {
      Gemm(true, false, T, s.v_dim, T, 1.0f, p, T, dout_h, ld_out, 1.0f, dv + kv * s.v_dim, ld_v);
    }
    if (!need_scores_grad) continue;
    Gemm(false, true, T, T, s.v_dim, 1.0f, dout_h, ld_out, v + kv * s.v_dim, ld_v, 0.0f,
         ds.data(), T);
    SoftmaxBackwardInPlace(p, ds.data(), T);
    if (dq != nullptr) {
      Gemm(false, false, T, s.qk_dim, T, s.scale, ds.data(), T, k + kv * s.qk_dim, ld_k, 1.0f,
           dq + h * s.qk_dim, ld_q);
    }
    if (dk != nullptr) {
      Gemm(true, false, T, s.qk_dim, T, s.scale, ds.data(), T, q + h * s.qk_dim, ld_q, 1.0f,
           dk + kv * s.qk_dim, ld_k);
    }
  }
}

// A single query row: two matrix-vector products per head. sgemv beats both an m = 1 Gemm and
// plain loops (which GCC does not vectorize at -O2) by about 2x at T=128, D=32.
void DecodeAttention(const float* q, const float* k_cache, const float* v_cache, int len,
                     float* out, const kernels::AttentionShape& s, float* scratch) {
  const int ld_k = s.kv_heads * s.qk_dim, ld_v = s.kv_heads * s.v_dim;
  const int group = s.heads / s.kv_heads;
  for (int h = 0; h < s.heads; ++h) {
    const int kv = h / group;
    cblas_sgemv(CblasRowMajor, CblasNoTrans, len, s.qk_dim, s.scale, k_cache + kv * s.qk_dim, ld_k,
                q + h * s.qk_dim, 1, 0.0f, scratch, 1);
    SoftmaxInPlace(scratch, len);
    cblas_sgemv(CblasRowMajor, CblasTrans, len, s.v_dim, 1.0f, v_cache + kv * s.v_dim, ld_v,
                scratch, 1, 0.0f, out + h * s.v_dim, 1);
  }
}

void CausalAttention(const float* q, const float* k, const float* v, float* out, float* probs,
                     int T, int H, int KV, int D) {
  CausalAttention(q, k, v, out, probs, T, kernels::AttentionShape::Standard(H, KV, D));
}

void CausalAttentionBackward(const float* q, const float* k, const float* v, const float* probs,
                             const float* dout, float* dq, float* dk, float* dv, int T, int H,
                             int KV, int D) {
  CausalAttentionBackward(q, k, v, probs, dout, dq, dk, dv, T,
                          kernels::AttentionShape::Standard(H, KV, D));
}

void DecodeAttention(const float* q, const float* k_cache, const float* v_cache, int len,
                     float* out, int H, int KV, int D, float* scratch) {
  DecodeAttention(q, k_cache, v_cache, len, out, kernels::AttentionShape::Standard(H, KV, D),
                  scratch);
}

}  // namespace tandem::cpu
