#ifndef TANDEM_ENGINE_CPU_MODEL_OPS_H_
#define TANDEM_ENGINE_CPU_MODEL_OPS_H_

#include <vector>

#include "engine/config.h"
#include "engine/model_ops.h"
#include "kernels/cpu/rope.h"

namespace tandem::engine {

// ModelOps over the CPU kernels (kernels/cpu, OpenBLAS), on host memory. Not thread-safe (it
// keeps the decode attention's scratch).
class CpuModelOps final : public ModelOps {
 public:
  explicit CpuModelOps(const ModelConfig& config);

  void Linear(const float* x, const float* w, float* y, int rows, int in, int out,
              bool accumulate) override;
  void LinearBackward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                      int rows, int in, int out) override;
  void ProjectGroups(const float* x, const std::vector<int>& offsets, const float* w,
                     int64_t w_stride, int in, int out, const std::optional<LoraProjection>& lora,
                     std::vector<float>& lora_h, float* y) override;
  void ProjectGroupsBackward(const float* x, const std::vector<int>& offsets, const float* w,
                             float* w_grad, int64_t w_stride, int in, int out,
                             const std::optional<LoraProjection>& lora,
                             const std::vector<float>& lora_h, const float* dy, float* dx) override;
  void RmsNorm(const float* x, const float* w, float* y, float* rstd, int rows, int width,
               float eps) override;
  void RmsNormBackward(const float* x, const float* w, const float* rstd, const float* dy,
                       float* dx, float* dw, int rows, int width) override;
  void Rope(float* x, const int* positions, int rows, int heads) override;
  void RopeBackward(float* dx, const int* positions, int rows, int heads) override;
  void CausalAttention(const float* q, const float* k, const float* v, float* out, float* probs,
                       int length, const cpu::AttentionShape& shape) override;
  void CausalAttentionBackward(const float* q, const float* k, const float* v, const float* probs,
                               const float* dout, float* dq, float* dk, float* dv, int length,
                               const cpu::AttentionShape& shape) override;
  void DecodeAttention(const float* q, const float* k_cache, const float* v_cache, int length,
                       float* out, const cpu::AttentionShape& shape) override;
  void SwiGlu(const float* gate, const float* up, float* out, int64_t n) override;
  void SwiGluBackward(const float* gate, const float* up, const float* dout, float* dgate,
                      float* dup, int64_t n) override;
  void EmbeddingGather(const float* table, const int* tokens, float* out, int rows,
                       int width) override;
  void EmbeddingBackward(const float* dout, const int* tokens, float* dtable, int rows,
                         int width) override;
  void RouterScores(const float* logits, float* scores, int rows, int experts,
                    cpu::ScoringFunction scoring) override;
  void TopK(const float* scores, const float* selection_bias, int rows, int experts, int k,
            int16_t* ids, const cpu::GroupLimit& limit) override;
  void GateWeights(const float* scores, const int16_t* ids, int rows, int experts, int k,
                   bool normalize, float* gates) override;
  void RouterGatesBackward(const float* logits, const float* scores, const int16_t* ids,
                           const float* dgates, float* dlogits, int rows, int experts, int k,
                           bool normalize, cpu::ScoringFunction scoring) override;
  cpu::ExpertPermutation BuildPermutation(const int16_t* ids, int rows, int k,
                                          int experts) override;
  void PermuteRows(const float* x, const cpu::ExpertPermutation& permutation, float* out,
                   int width) override;
  void PermuteRowsBackward(const float* dout, const cpu::ExpertPermutation& permutation, float* dx,
                           int width) override;
  void UnpermuteAdd(const float* y, const cpu::ExpertPermutation& permutation, const float* gates,
                    float* out, int width) override;
  void UnpermuteAddBackward(const float* y, const cpu::ExpertPermutation& permutation,
                            const float* gates, const float* dout, float* dy, float* dgates,
                            int width) override;
  void Add(float* target, const float* values, int64_t n) override;
  void Scale(float* x, float factor, int64_t n) override;
  void RoundToBf16(float* x, int64_t n) override;
  void QuantizeRowsToE4M3(float* x, int64_t rows, int64_t width) override;
  void CopyColumns(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                   int64_t rows, int width, bool accumulate) override;
  void Deinterleave(float* x, int width, int64_t count) override;
  void Reinterleave(float* x, int width, int64_t count) override;

 private:
  const cpu::RopeFrequencies rope_;
  std::vector<float> decode_scratch_;
};

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_CPU_MODEL_OPS_H_
