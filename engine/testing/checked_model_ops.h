#ifndef TANDEM_ENGINE_TESTING_CHECKED_MODEL_OPS_H_
#define TANDEM_ENGINE_TESTING_CHECKED_MODEL_OPS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/cpu_model_ops.h"
#include "engine/model_ops.h"

namespace tandem::engine::testing {

// A backend whose memory the model graph provably touches only through operations: buffers come
// from an arena that is PROT_NONE except while one of this backend's own calls runs (any read or
// write from elsewhere faults), every call checks that each buffer argument holds what the call
// reads or writes, and calls are counted by name. The computing is the CPU kernels' (CpuModelOps),
// so results equal the CPU backend's exactly. Single-threaded.
class CheckedModelOps final : public ModelOps {
 public:
  explicit CheckedModelOps(const ModelConfig& config);
  ~CheckedModelOps() override;

  // Arguments that were too small for their call, one line each ("Linear y: 12 < 24").
  const std::vector<std::string>& violations() const { return violations_; }
  const std::map<std::string, int64_t>& calls() const { return calls_; }

  absl::Status Finish() override;
  const BackendCapabilities& capabilities() const override;
  absl::StatusOr<WeightRef> Bind(const HostWeight& weight) override;
  void Copy(Ref<const float> source, Ref<float> target, int64_t count) override;
  void Fill(Ref<float> target, float value, int64_t count) override;
  void Linear(Ref<const float> x, WeightRef w, Ref<float> y, int rows, int in, int out,
              bool accumulate) override;
  void LinearBackward(Ref<const float> x, WeightRef w, Ref<const float> dy, Ref<float> dx, int rows,
                      int in, int out) override;
  void ProjectGroups(Ref<const float> x, const std::vector<int>& offsets, WeightRef w,
                     int64_t w_stride, int in, int out, const std::optional<LoraProjection>& lora,
                     Buffer<float>& lora_h, Ref<float> y) override;
  void ProjectGroupsBackward(Ref<const float> x, const std::vector<int>& offsets, WeightRef w,
                             int64_t w_stride, int in, int out,
                             const std::optional<LoraProjection>& lora, Ref<const float> lora_h,
                             Ref<const float> dy, Ref<float> dx) override;
  void RmsNorm(Ref<const float> x, WeightRef w, Ref<float> y, Ref<float> rstd, int rows, int width,
               float eps) override;
  void RmsNormBackward(Ref<const float> x, WeightRef w, Ref<const float> rstd, Ref<const float> dy,
                       Ref<float> dx, int rows, int width) override;
  void Rope(Ref<float> x, Ref<const int> positions, int rows, int heads) override;
  void RopeBackward(Ref<float> dx, Ref<const int> positions, int rows, int heads) override;
  void CausalAttention(Ref<const float> q, Ref<const float> k, Ref<const float> v, Ref<float> out,
                       Ref<float> probs, int length, const kernels::AttentionShape& shape) override;
  void CausalAttentionBackward(Ref<const float> q, Ref<const float> k, Ref<const float> v,
                               Ref<const float> probs, Ref<const float> dout, Ref<float> dq,
                               Ref<float> dk, Ref<float> dv, int length,
                               const kernels::AttentionShape& shape) override;
  void DecodeAttention(Ref<const float> q, Ref<const float> k_cache, Ref<const float> v_cache,
                       int length, Ref<float> out, const kernels::AttentionShape& shape) override;
  void SwiGlu(Ref<const float> gate, Ref<const float> up, Ref<float> out, int64_t n) override;
  void SwiGluBackward(Ref<const float> gate, Ref<const float> up, Ref<const float> dout,
                      Ref<float> dgate, Ref<float> dup, int64_t n) override;
  void EmbeddingGather(WeightRef table, Ref<const int> tokens, Ref<float> out, int rows,
                       int width) override;
  void EmbeddingBackward(Ref<const float> dout, Ref<const int> tokens, WeightRef table, int rows,
                         int width) override;
  void RouterScores(Ref<const float> logits, Ref<float> scores, int rows, int experts,
                    kernels::ScoringFunction scoring) override;
  void TopK(Ref<const float> scores, WeightRef selection_bias, int rows, int experts, int k,
            Ref<int16_t> ids, const kernels::GroupLimit& limit) override;
  void GateWeights(Ref<const float> scores, Ref<const int16_t> ids, int rows, int experts, int k,
                   bool normalize, Ref<float> gates) override;
  void RouterGatesBackward(Ref<const float> logits, Ref<const float> scores, Ref<const int16_t> ids,
                           Ref<const float> dgates, Ref<float> dlogits, int rows, int experts,
                           int k, bool normalize, kernels::ScoringFunction scoring) override;
  ExpertPermutation BuildPermutation(Ref<const int16_t> ids, int rows, int k, int experts) override;
  void PermuteRows(Ref<const float> x, const ExpertPermutation& permutation, Ref<float> out,
                   int width) override;
  void PermuteRowsBackward(Ref<const float> dout, const ExpertPermutation& permutation,
                           Ref<float> dx, int width) override;
  void UnpermuteAdd(Ref<const float> y, const ExpertPermutation& permutation,
                    Ref<const float> gates, Ref<float> out, int width) override;
  void UnpermuteAddBackward(Ref<const float> y, const ExpertPermutation& permutation,
                            Ref<const float> gates, Ref<const float> dout, Ref<float> dy,
                            Ref<float> dgates, int width) override;
  void FoldLogSumExp(Ref<const float> logits, Ref<const int> targets, Ref<float> lse,
                     Ref<float> target_logit, int rows, int first_column, int width) override;
  void TokenLogProbsChunkBackward(Ref<const float> logits, Ref<const int> targets,
                                  Ref<const float> lse, Ref<const float> dlogprob,
                                  Ref<float> dlogits, int rows, int first_column,
                                  int width) override;
  void Add(Ref<float> target, Ref<const float> values, int64_t n) override;
  void Scale(Ref<float> x, float factor, int64_t n) override;
  void RoundToBf16(Ref<float> x, int64_t n) override;
  void QuantizeRowsToE4M3(Ref<float> x, int64_t rows, int64_t width) override;
  void CopyColumns(Ref<const float> src, int64_t src_stride, Ref<float> dst, int64_t dst_stride,
                   int64_t rows, int width, bool accumulate) override;
  void Deinterleave(Ref<float> x, int width, int64_t count) override;
  void Reinterleave(Ref<float> x, int width, int64_t count) override;
  void CopyIn(const float* host, Ref<float> target, int64_t count) override;
  void CopyIn(const int* host, Ref<int> target, int64_t count) override;
  void CopyIn(const int16_t* host, Ref<int16_t> target, int64_t count) override;
  void CopyOut(Ref<const float> source, float* host, int64_t count) override;
  void CopyOut(Ref<const int16_t> source, int16_t* host, int64_t count) override;

 protected:
  std::shared_ptr<void> AllocateBytes(int64_t bytes) override;

 private:
  class Call;
  // Records a violation unless `ref` (skipped when null) holds `count` elements.
  template <typename T>
  void Need(const char* call, const char* argument, Ref<T> ref, int64_t count);
  void Need(const char* call, const char* argument, WeightRef weight, int64_t count);

  const int64_t rope_width_;  // Floats per head that Rope rotates.
  CpuModelOps cpu_;
  char* arena_ = nullptr;
  int64_t arena_used_ = 0;
  int depth_ = 0;  // Calls in progress (operations call Resize, which may allocate).
  std::vector<std::string> violations_;
  std::map<std::string, int64_t> calls_;
};

}  // namespace tandem::engine::testing

#endif  // TANDEM_ENGINE_TESTING_CHECKED_MODEL_OPS_H_
