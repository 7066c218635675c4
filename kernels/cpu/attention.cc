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

// Per head, q is a [T, D] view with row stride H*D and k, v views with row stride KV*D, so each
// head is two strided GEMMs.
void CausalAttention(const float* q, const float* k, const float* v, float* out, float* probs,
                     int T, int H, int KV, int D) {
  const int ld = H * D;
  const int ld_kv = KV * D;
  const int group = H / KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (int h = 0; h < H; ++h) {
    const int kv = (h / group) * D;
    float* p = probs + static_cast<int64_t>(h) * T * T;
    Gemm(false, true, T, T, D, scale, q + h * D, ld, k + kv, ld_kv, 0.0f, p, T);
    CausalSoftmax(p, T);
    Gemm(false, false, T, D, T, 1.0f, p, T, v + kv, ld_kv, 0.0f, out + h * D, ld);
  }
}

void CausalAttentionBackward(const float* q, const float* k, const float* v, const float* probs,
                             const float* dout, float* dq, float* dk, float* dv, int T, int H,
                             int KV, int D) {
  const int ld = H * D;
  const int ld_kv = KV * D;
  const int group = H / KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const bool need_scores_grad = dq != nullptr || dk != nullptr;
  std::vector<float> ds(need_scores_grad ? static_cast<size_t>(T) * T : 0);
  for (int h = 0; h < H; ++h) {
    const int kv = (h / group) * D;
    const float* p = probs + static_cast<int64_t>(h) * T * T;
    const float* dout_h = dout + h * D;
    if (dv != nullptr) Gemm(true, false, T, D, T, 1.0f, p, T, dout_h, ld, 1.0f, dv + kv, ld_kv);
    if (!need_scores_grad) continue;
    Gemm(false, true, T, T, D, 1.0f, dout_h, ld, v + kv, ld_kv, 0.0f, ds.data(), T);
    SoftmaxBackwardInPlace(p, ds.data(), T);
    if (dq != nullptr) {
      Gemm(false, false, T, D, T, scale, ds.data(), T, k + kv, ld_kv, 1.0f, dq + h * D, ld);
    }
    if (dk != nullptr) {
      Gemm(true, false, T, D, T, scale, ds.data(), T, q + h * D, ld, 1.0f, dk + kv, ld_kv);
    }
  }
}

// A single query row: two matrix-vector products per head. sgemv beats both an m = 1 Gemm and
// plain loops (which GCC does not vectorize at -O2) by about 2x at T=128, D=32.
void DecodeAttention(const float* q, const float* k_cache, const float* v_cache, int len,
                     float* out, int H, int KV, int D, float* scratch) {
  const int ld_kv = KV * D;
  const int group = H / KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (int h = 0; h < H; ++h) {
    const int kv = (h / group) * D;
    cblas_sgemv(CblasRowMajor, CblasNoTrans, len, D, scale, k_cache + kv, ld_kv, q + h * D, 1, 0.0f,
                scratch, 1);
    SoftmaxInPlace(scratch, len);
    cblas_sgemv(CblasRowMajor, CblasTrans, len, D, 1.0f, v_cache + kv, ld_kv, scratch, 1, 0.0f,
                out + h * D, 1);
  }
}

}  // namespace tandem::cpu
