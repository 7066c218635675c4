#ifndef TANDEM_ENGINE_MODEL_OPS_H_
#define TANDEM_ENGINE_MODEL_OPS_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/model.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/permute.h"
#include "kernels/cpu/router.h"

namespace tandem::engine {

// Every computation the transformer's graph makes, so that one graph runs over whichever
// backend implements them (the CPU kernels here, CUDA's in kernels/cuda). Arrays are row-major
// float32 unless named otherwise; "+=" marks operations that accumulate into their output.
class ModelOps {
 public:
  virtual ~ModelOps() = default;

  // Projections. y = x·Wᵀ (y += x·Wᵀ with `accumulate`), x [rows, in], W [out, in].
  virtual void Linear(const float* x, const float* w, float* y, int rows, int in, int out,
                      bool accumulate) = 0;
  // dx += dy·W; dw += dyᵀ·x when dw is set.
  virtual void LinearBackward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                              int rows, int in, int out) = 0;
  // y = x_g·W_gᵀ per row group g of `offsets` (W_g at g·w_stride: one dense projection with
  // stride 0, or one expert per group), plus the LoRA's contribution; lora_h keeps x·Aᵀ.
  virtual void ProjectGroups(const float* x, const std::vector<int>& offsets, const float* w,
                             int64_t w_stride, int in, int out,
                             const std::optional<LoraProjection>& lora, std::vector<float>& lora_h,
                             float* y) = 0;
  // Backward of ProjectGroups: dx += dy·W_g; w_grad (if set) += dyᵀ·x; LoRA gradients.
  virtual void ProjectGroupsBackward(const float* x, const std::vector<int>& offsets,
                                     const float* w, float* w_grad, int64_t w_stride, int in,
                                     int out, const std::optional<LoraProjection>& lora,
                                     const std::vector<float>& lora_h, const float* dy,
                                     float* dx) = 0;

  // RMSNorm of `rows` rows of `width`; rstd [rows] kept for the backward. dx += ∂/∂x, dw (if
  // set) += ∂/∂w.
  virtual void RmsNorm(const float* x, const float* w, float* y, float* rstd, int rows, int width,
                       float eps) = 0;
  virtual void RmsNormBackward(const float* x, const float* w, const float* rstd, const float* dy,
                               float* dx, float* dw, int rows, int width) = 0;
  // The model's rotary embedding, in place, on [rows, heads, rotary dim] at `positions`.
  virtual void Rope(float* x, const int* positions, int rows, int heads) = 0;
  virtual void RopeBackward(float* dx, const int* positions, int rows, int heads) = 0;

  // Causal attention within one sequence of `length` rows; probs [heads, length, length] kept.
  virtual void CausalAttention(const float* q, const float* k, const float* v, float* out,
                               float* probs, int length, const cpu::AttentionShape& shape) = 0;
  // dq, dk, dv +=.
  virtual void CausalAttentionBackward(const float* q, const float* k, const float* v,
                                       const float* probs, const float* dout, float* dq, float* dk,
                                       float* dv, int length, const cpu::AttentionShape& shape) = 0;
  // One query row over `length` cached keys and values.
  virtual void DecodeAttention(const float* q, const float* k_cache, const float* v_cache,
                               int length, float* out, const cpu::AttentionShape& shape) = 0;

  // out = silu(gate) * up over n values; dgate, dup +=.
  virtual void SwiGlu(const float* gate, const float* up, float* out, int64_t n) = 0;
  virtual void SwiGluBackward(const float* gate, const float* up, const float* dout, float* dgate,
                              float* dup, int64_t n) = 0;
  virtual void EmbeddingGather(const float* table, const int* tokens, float* out, int rows,
                               int width) = 0;
  // dtable +=.
  virtual void EmbeddingBackward(const float* dout, const int* tokens, float* dtable, int rows,
                                 int width) = 0;

  // The router (kernels/cpu/router.h has the contracts).
  virtual void RouterScores(const float* logits, float* scores, int rows, int experts,
                            cpu::ScoringFunction scoring) = 0;
  virtual void TopK(const float* scores, const float* selection_bias, int rows, int experts, int k,
                    int16_t* ids, const cpu::GroupLimit& limit) = 0;
  virtual void GateWeights(const float* scores, const int16_t* ids, int rows, int experts, int k,
                           bool normalize, float* gates) = 0;
  virtual void RouterGatesBackward(const float* logits, const float* scores, const int16_t* ids,
                                   const float* dgates, float* dlogits, int rows, int experts,
                                   int k, bool normalize, cpu::ScoringFunction scoring) = 0;

  // Token dispatch by expert (kernels/cpu/permute.h has the contracts).
  virtual cpu::ExpertPermutation BuildPermutation(const int16_t* ids, int rows, int k,
                                                  int experts) = 0;
  virtual void PermuteRows(const float* x, const cpu::ExpertPermutation& permutation, float* out,
                           int width) = 0;
  virtual void PermuteRowsBackward(const float* dout, const cpu::ExpertPermutation& permutation,
                                   float* dx, int width) = 0;
  virtual void UnpermuteAdd(const float* y, const cpu::ExpertPermutation& permutation,
                            const float* gates, float* out, int width) = 0;
  virtual void UnpermuteAddBackward(const float* y, const cpu::ExpertPermutation& permutation,
                                    const float* gates, const float* dout, float* dy, float* dgates,
                                    int width) = 0;

  // Elementwise and copies.
  virtual void Add(float* target, const float* values, int64_t n) = 0;  // target += values
  virtual void Scale(float* x, float factor, int64_t n) = 0;
  virtual void RoundToBf16(float* x, int64_t n) = 0;
  // Each row rounded to FP8 E4M3 with a per-row scale (the input of FP8 linear layers).
  virtual void QuantizeRowsToE4M3(float* x, int64_t rows, int64_t width) = 0;
  // `width` columns of `rows` rows: dst[r·dst_stride + c] (+)= src[r·src_stride + c]. A source
  // stride of 0 repeats one row.
  virtual void CopyColumns(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                           int64_t rows, int width, bool accumulate) = 0;
  // Each of `count` vectors of `width` (even) reordered [x0, x1, x2, x3, ...] ->
  // [x0, x2, ..., x1, x3, ...] (DeepSeek's interleaved rotary pairs); Reinterleave undoes it.
  virtual void Deinterleave(float* x, int width, int64_t count) = 0;
  virtual void Reinterleave(float* x, int width, int64_t count) = 0;
};

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_MODEL_OPS_H_
