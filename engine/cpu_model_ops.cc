#include "engine/cpu_model_ops.h"

#include <algorithm>

#include "common/dtype.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/grouped_lora.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/swiglu.h"

namespace tandem::engine {

CpuModelOps::CpuModelOps(const ModelConfig& config)
    : rope_(config.RopeFrequencies()), decode_scratch_(config.max_seq_len) {}

void CpuModelOps::Linear(const float* x, const float* w, float* y, int rows, int in, int out,
                         bool accumulate) {
  cpu::Linear(x, w, y, rows, in, out, accumulate);
}

void CpuModelOps::LinearBackward(const float* x, const float* w, const float* dy, float* dx,
                                 float* dw, int rows, int in, int out) {
  cpu::LinearBackward(x, w, dy, dx, dw, rows, in, out);
}

void CpuModelOps::ProjectGroups(const float* x, const std::vector<int>& offsets, const float* w,
                                int64_t w_stride, int in, int out,
                                const std::optional<LoraProjection>& lora,
                                std::vector<float>& lora_h, float* y) {
  const int groups = static_cast<int>(offsets.size()) - 1;
  for (int g = 0; g < groups; ++g) {
    const int rows = offsets[g + 1] - offsets[g];
    if (rows == 0) continue;
    cpu::Gemm(false, true, rows, out, in, 1.0f, x + int64_t{offsets[g]} * in, in, w + g * w_stride,
              in, 0.0f, y + int64_t{offsets[g]} * out, out);
  }
  if (!lora.has_value()) return;
  lora_h.resize(static_cast<size_t>(offsets.back()) * lora->weights.rank);
  cpu::GroupedLoraForward(x, offsets.data(), groups, in, out, lora->weights, lora_h.data(), y);
}

void CpuModelOps::ProjectGroupsBackward(const float* x, const std::vector<int>& offsets,
                                        const float* w, float* w_grad, int64_t w_stride, int in,
                                        int out, const std::optional<LoraProjection>& lora,
                                        const std::vector<float>& lora_h, const float* dy,
                                        float* dx) {
  const int groups = static_cast<int>(offsets.size()) - 1;
  for (int g = 0; g < groups; ++g) {
    const int rows = offsets[g + 1] - offsets[g];
    if (rows == 0) continue;
    const float* dy_g = dy + int64_t{offsets[g]} * out;
    const float* x_g = x + int64_t{offsets[g]} * in;
    cpu::Gemm(false, false, rows, in, out, 1.0f, dy_g, out, w + g * w_stride, in, 1.0f,
              dx + int64_t{offsets[g]} * in, in);
    if (w_grad != nullptr) {
      cpu::Gemm(true, false, out, in, rows, 1.0f, dy_g, out, x_g, in, 1.0f, w_grad + g * w_stride,
                in);
    }
  }
  if (!lora.has_value()) return;
  cpu::GroupedLoraBackward(x, offsets.data(), groups, in, out, lora->weights, lora_h.data(), dy, dx,
                           lora->a_grad, lora->b_grad);
}

void CpuModelOps::RmsNorm(const float* x, const float* w, float* y, float* rstd, int rows,
                          int width, float eps) {
  cpu::RmsNorm(x, w, y, rstd, rows, width, eps);
}

void CpuModelOps::RmsNormBackward(const float* x, const float* w, const float* rstd,
                                  const float* dy, float* dx, float* dw, int rows, int width) {
  cpu::RmsNormBackward(x, w, rstd, dy, dx, dw, rows, width);
}

void CpuModelOps::Rope(float* x, const int* positions, int rows, int heads) {
  cpu::Rope(x, positions, rows, heads, rope_);
}

void CpuModelOps::RopeBackward(float* dx, const int* positions, int rows, int heads) {
  cpu::RopeBackward(dx, positions, rows, heads, rope_);
}

void CpuModelOps::CausalAttention(const float* q, const float* k, const float* v, float* out,
                                  float* probs, int length, const cpu::AttentionShape& shape) {
  cpu::CausalAttention(q, k, v, out, probs, length, shape);
}

void CpuModelOps::CausalAttentionBackward(const float* q, const float* k, const float* v,
                                          const float* probs, const float* dout, float* dq,
                                          float* dk, float* dv, int length,
                                          const cpu::AttentionShape& shape) {
  cpu::CausalAttentionBackward(q, k, v, probs, dout, dq, dk, dv, length, shape);
}

void CpuModelOps::DecodeAttention(const float* q, const float* k_cache, const float* v_cache,
                                  int length, float* out, const cpu::AttentionShape& shape) {
  cpu::DecodeAttention(q, k_cache, v_cache, length, out, shape, decode_scratch_.data());
}

void CpuModelOps::SwiGlu(const float* gate, const float* up, float* out, int64_t n) {
  cpu::SwiGlu(gate, up, out, n);
}

void CpuModelOps::SwiGluBackward(const float* gate, const float* up, const float* dout,
                                 float* dgate, float* dup, int64_t n) {
  cpu::SwiGluBackward(gate, up, dout, dgate, dup, n);
}

void CpuModelOps::EmbeddingGather(const float* table, const int* tokens, float* out, int rows,
                                  int width) {
  cpu::EmbeddingGather(table, tokens, out, rows, width);
}

void CpuModelOps::EmbeddingBackward(const float* dout, const int* tokens, float* dtable, int rows,
                                    int width) {
  cpu::EmbeddingBackward(dout, tokens, dtable, rows, width);
}

void CpuModelOps::RouterScores(const float* logits, float* scores, int rows, int experts,
                               cpu::ScoringFunction scoring) {
  cpu::RouterScores(logits, scores, rows, experts, scoring);
}

void CpuModelOps::TopK(const float* scores, const float* selection_bias, int rows, int experts,
                       int k, int16_t* ids, const cpu::GroupLimit& limit) {
  cpu::TopK(scores, selection_bias, rows, experts, k, ids, limit);
}

void CpuModelOps::GateWeights(const float* scores, const int16_t* ids, int rows, int experts, int k,
                              bool normalize, float* gates) {
  cpu::GateWeights(scores, ids, rows, experts, k, normalize, gates);
}

void CpuModelOps::RouterGatesBackward(const float* logits, const float* scores, const int16_t* ids,
                                      const float* dgates, float* dlogits, int rows, int experts,
                                      int k, bool normalize, cpu::ScoringFunction scoring) {
  cpu::RouterGatesBackward(logits, scores, ids, dgates, dlogits, rows, experts, k, normalize,
                           scoring);
}

cpu::ExpertPermutation CpuModelOps::BuildPermutation(const int16_t* ids, int rows, int k,
                                                     int experts) {
  return cpu::BuildPermutation(ids, rows, k, experts);
}

void CpuModelOps::PermuteRows(const float* x, const cpu::ExpertPermutation& permutation, float* out,
                              int width) {
  cpu::PermuteRows(x, permutation, out, width);
}

void CpuModelOps::PermuteRowsBackward(const float* dout, const cpu::ExpertPermutation& permutation,
                                      float* dx, int width) {
  cpu::PermuteRowsBackward(dout, permutation, dx, width);
}

void CpuModelOps::UnpermuteAdd(const float* y, const cpu::ExpertPermutation& permutation,
                               const float* gates, float* out, int width) {
  cpu::UnpermuteAdd(y, permutation, gates, out, width);
}

void CpuModelOps::UnpermuteAddBackward(const float* y, const cpu::ExpertPermutation& permutation,
                                       const float* gates, const float* dout, float* dy,
                                       float* dgates, int width) {
  cpu::UnpermuteAddBackward(y, permutation, gates, dout, dy, dgates, width);
}

void CpuModelOps::Add(float* target, const float* values, int64_t n) {
  for (int64_t i = 0; i < n; ++i) target[i] += values[i];
}

void CpuModelOps::Scale(float* x, float factor, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= factor;
}

void CpuModelOps::RoundToBf16(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = ToFloat(ToBFloat16(x[i]));
}

void CpuModelOps::QuantizeRowsToE4M3(float* x, int64_t rows, int64_t width) {
  cpu::QuantizeRowsToE4M3(x, rows, width);
}

void CpuModelOps::CopyColumns(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                              int64_t rows, int width, bool accumulate) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* from = src + r * src_stride;
    float* to = dst + r * dst_stride;
    if (accumulate) {
      for (int c = 0; c < width; ++c) to[c] += from[c];
    } else {
      std::copy_n(from, width, to);
    }
  }
}

void CpuModelOps::Deinterleave(float* x, int width, int64_t count) {
  std::vector<float> reordered(width);
  for (int64_t n = 0; n < count; ++n) {
    float* v = x + n * width;
    for (int i = 0; i < width / 2; ++i) {
      reordered[i] = v[2 * i];
      reordered[width / 2 + i] = v[2 * i + 1];
    }
    std::copy(reordered.begin(), reordered.end(), v);
  }
}

void CpuModelOps::Reinterleave(float* x, int width, int64_t count) {
  std::vector<float> original(width);
  for (int64_t n = 0; n < count; ++n) {
    float* v = x + n * width;
    for (int i = 0; i < width / 2; ++i) {
      original[2 * i] = v[i];
      original[2 * i + 1] = v[width / 2 + i];
    }
    std::copy(original.begin(), original.end(), v);
  }
}

}  // namespace tandem::engine
