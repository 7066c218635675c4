#ifndef TANDEM_ENGINE_CUDA_CUDA_MODEL_OPS_H_
#define TANDEM_ENGINE_CUDA_CUDA_MODEL_OPS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/cuda/device_parameters.h"
#include "engine/cuda/operation_times.h"
#include "engine/cuda/staged_values.h"
#include "engine/model.h"
#include "engine/model_ops.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/rope.h"

namespace tandem::engine::cuda {

// ModelOps over the CUDA kernels (kernels/cuda), on one GPU: the CUDA backend of the one model
// graph. Buffers live in the device's stream-ordered pool; weights the graph hands over as the
// host parameters' addresses are used at the same places of their device copies (the base
// model's, shared by the engines on a GPU, and the adapter's); adapter gradients accumulate in
// device mirrors, which Finish adds to the host gradients. Operations enqueue work and return
// nothing: the first failure is kept, the operations after it do nothing, and Finish reports it.
// What the CUDA kernels do not cover yet is refused per operation (UNIMPLEMENTED naming it):
// FP8 activation quantization, the strided copies and interleaving of latent attention, and
// gradients of base weights (norms, router, embedding, dense weights: the base is frozen on the
// GPU). Not thread-safe; one engine's calls at a time.
class CudaModelOps final : public ModelOps {
 public:
  // `base` and `lora` (may be null) are the host models whose parameters the graph passes;
  // `base_device` is `base`'s device copy. All must outlive the backend.
  static absl::StatusOr<std::unique_ptr<CudaModelOps>> Create(
      const ModelConfig& config, int device, const BaseModel& base,
      std::shared_ptr<const DeviceParameters> base_device, LoraAdapter* lora);

  // Copies the adapter's host values to the device again (after an optimizer step or a load).
  absl::Status AdapterChanged() override;
  absl::Status Finish() override;
  // Device memory, f32 weights, the adapter's gradients only.
  const BackendCapabilities& capabilities() const override;
  // The device copy of a base or adapter weight (the adapter's gradient mirrors allocated with
  // the first adapter weight that trains).
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
  void AppendAndAttend(Ref<const float> q, Ref<const float> k, Ref<const float> v,
                       const std::vector<Ref<float>>& k_caches,
                       const std::vector<Ref<float>>& v_caches, const int* positions,
                       Ref<float> out, const kernels::AttentionShape& shape) override;
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
  CudaModelOps(int device, const BaseModel& base,
               std::shared_ptr<const DeviceParameters> base_device, LoraAdapter* lora,
               ::tandem::cuda::DeviceRopeFrequencies rope)
      : device_(device),
        base_(base),
        base_device_(std::move(base_device)),
        lora_(lora),
        rope_(std::move(rope)) {}

  // Runs `launch` unless an earlier operation failed; keeps its failure, named after `name`.
  void Run(const char* name, absl::FunctionRef<absl::Status()> launch);
  bool Failed() const { return !status_.ok(); }
  void Refuse(const char* name, const char* why);
  // Allocates the adapter's zeroed gradient mirrors, once.
  absl::Status MirrorAdapterGradients();
  // A weight's device gradient, noting that Finish has gradients to bring to the host.
  float* WrittenGradient(WeightRef weight);
  // The base part of a grouped projection, y = x·Wᵀ + beta·y, over `groups` row groups at device
  // `offsets` (group g's weight w + g·w_stride), and its backward dx += dy·W.
  void Multiply(const char* name, Ref<const float> x, const int* offsets, int groups, int max_rows,
                WeightRef w, int64_t w_stride, int in, int out, Ref<float> y, float beta);
  void MultiplyBackward(const char* name, Ref<const float> dy, const int* offsets, int groups,
                        int max_rows, WeightRef w, int64_t w_stride, int in, int out,
                        Ref<float> dx);
  // `offsets` on the device and GroupedGemm's row bound (all rows).
  const int* DeviceOffsets(const std::vector<int>& offsets, int& max_rows);
  // The device copy of `host` from `staged`; null (and a failure kept) when it fails.
  template <typename T>
  T* Staged(StagedValues<T>& staged, const std::vector<T>& host);
  float* Scratch(::tandem::cuda::DeviceArray<float>& scratch, int64_t floats);

  const int device_;
  const BaseModel& base_;
  const std::shared_ptr<const DeviceParameters> base_device_;
  LoraAdapter* const lora_;
  std::optional<DeviceParameters> adapter_device_, adapter_gradients_;
  const ::tandem::cuda::DeviceRopeFrequencies rope_;
  // Room for every MoE layer's group offsets of a pass and the positions of a decode step; every
  // layer's cache addresses of a decode step.
  StagedValues<int> staged_ints_{256};
  StagedValues<float*> staged_addresses_{256};
  ::tandem::cuda::DeviceArray<float> decode_scratch_, attention_workspace_, lora_workspace_;
  bool gradients_written_ = false;
  std::unique_ptr<OperationTimes> times_;  // With TANDEM_CUDA_PROFILE set.
  absl::Status status_;
};

}  // namespace tandem::engine::cuda

#endif  // TANDEM_ENGINE_CUDA_CUDA_MODEL_OPS_H_
