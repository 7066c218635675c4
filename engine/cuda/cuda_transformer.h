#ifndef TANDEM_ENGINE_CUDA_CUDA_TRANSFORMER_H_
#define TANDEM_ENGINE_CUDA_CUDA_TRANSFORMER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/cuda/device_parameters.h"
#include "engine/decode_engine.h"
#include "engine/model.h"
#include "engine/training_engine.h"
#include "engine/transformer.h"
#include "kernels/cuda/rope.h"

namespace tandem::engine::cuda {

// engine::Transformer's full-sequence forward and backward on a GPU: the same model, adapter,
// routing (live, replayed, or live where a replayed row is -1) and results in fp32, computed by
// the kernels/cuda twins. The base model is uploaded once and stays frozen; the adapter is
// uploaded again on AdapterChanged (a refit), and Backward adds its gradients into the host
// adapter's gradient tensors, so the host optimizer and checkpoints work unchanged.
//
// It is also a DecodeEngine for generation, its caches in device memory: a cache made by one
// CudaTransformer serves every other on the same GPU.
//
// Not yet on the GPU (UNIMPLEMENTED from Create): latent attention, FP8 and INT8. One caller at
// a time, as the CPU Transformer; engines on one GPU may be used from different threads.
class CudaTransformer : public TrainingEngine, public DecodeEngine {
 public:
  struct Options {
    int device = 0;  // The GPU, made current for the creating thread.
    // fp32, or bf16 (the rollout's inference mode: activations rounded to bf16 where the CPU
    // Transformer rounds them; the weights are rounded by the caller, BaseModel::ForPrecision).
    Precision precision = Precision::kF32;
    // Another CudaTransformer's base() of the same model, shared instead of uploaded again.
    std::shared_ptr<const DeviceParameters> base;
  };

  // Neither model is owned; both must outlive this object; lora may be null.
  // FAILED_PRECONDITION without the GPU, RESOURCE_EXHAUSTED when the weights do not fit,
  // UNIMPLEMENTED for what the GPU path lacks (latent attention, FP8/INT8, > 64 expert groups).
  static absl::StatusOr<std::unique_ptr<CudaTransformer>> Create(const BaseModel& model,
                                                                 LoraAdapter* lora,
                                                                 Options options);
  static absl::StatusOr<std::unique_ptr<CudaTransformer>> Create(const BaseModel& model,
                                                                 LoraAdapter* lora) {
    return Create(model, lora, Options{});
  }
  ~CudaTransformer() override;

  // Copies the adapter's (changed) tensors to the GPU.
  absl::Status AdapterChanged() override;

  // Same contract as Transformer::Forward: activations are kept for Backward, and the logits
  // are copied to the host once.
  absl::StatusOr<const float*> Forward(const TokenBatch& batch,
                                       const std::vector<int16_t>* replay) override;

  // Backpropagates dlogits [tokens, vocab] (host memory) of the last Forward, plus dhidden
  // [tokens, d_model] if non-null, and adds the adapter's gradients into its host gradient
  // tensors (enable them first). FAILED_PRECONDITION without gradients, in the bf16 mode, or
  // when the last pass was not a Forward (a Prefill or Decode in between replaces its
  // activations).
  absl::Status Backward(const float* dlogits, const float* dhidden) override;

  const std::vector<int16_t>& routes() const override { return routes_; }
  const std::vector<int16_t>& live_routes() const override { return live_routes_; }
  const RoutingStats& routing_stats() const override { return stats_; }
  // The final normalized hidden states [tokens, d_model] of the last Forward (host copy; empty
  // after a Prefill or Decode).
  const std::vector<float>& final_hidden() const override { return final_hidden_; }
  const ModelConfig& config() const override { return config_; }
  std::shared_ptr<const DeviceParameters> base() const { return base_; }

  // DecodeEngine: RESOURCE_EXHAUSTED when a cache does not fit on the GPU.
  absl::StatusOr<std::unique_ptr<SequenceCache>> NewCache(int positions) override;
  // All prompts in one pass; INVALID_ARGUMENT naming a prompt longer than its cache.
  absl::Status Prefill(const std::vector<PromptToPrefill>& prompts, float* last_logits,
                       int16_t* routes) override;
  absl::Status Decode(const int* tokens, const int* positions,
                      const std::vector<SequenceCache*>& caches, float* logits,
                      int16_t* routes) override;

 private:
  struct Activations;  // One layer's forward results, kept for the backward.
  struct Pass;         // The last Forward: inputs, routing bookkeeping, activations.
  // Training attends within packed sequences; a prefill also fills each prompt's cache; a
  // decode row attends over its own cache.
  enum class PassMode { kPackedSequences, kPrefill, kDecode };
  struct DeviceSequenceCache;

  CudaTransformer(const BaseModel& model, LoraAdapter* lora, int device, Precision precision,
                  std::shared_ptr<const DeviceParameters> base,
                  std::unique_ptr<DeviceParameters> adapter,
                  ::tandem::cuda::DeviceRopeFrequencies rope);

  // A pass over `tokens` at `positions`: packed sequences (Forward), prompts filling their caches
  // (Prefill) or one row per cache (Decode). Leaves logits_, routes_ and final_hidden_, and the
  // activations in pass_ (none after a failure).
  absl::Status RunPass(const int* tokens, std::vector<int> positions,
                       std::vector<int> sequence_starts, const std::vector<int16_t>* replay,
                       std::vector<DeviceSequenceCache*> caches, PassMode mode);
  absl::Status BeginPass(const int* tokens, std::vector<int> positions,
                         std::vector<int> sequence_starts, const std::vector<int16_t>* replay,
                         std::vector<DeviceSequenceCache*> caches, PassMode mode);
  absl::Status RunLayers();
  // The last pass's logits and routes into the caller's buffers (routes may be null).
  void CopyOutputs(float* logits, int16_t* routes) const;
  // Positions a cache made by NewCache holds.
  int Capacity(const SequenceCache& cache) const;
  absl::Status AllocateLayer(int layer, Activations& act) const;
  absl::Status RunLayer(int layer, const float* x, float* out);
  absl::Status RunAttention(int layer, Activations& act);
  absl::Status AttendOverCaches(int layer, Activations& act);
  absl::Status RunMoeFfn(int layer, Activations& act, float* out);
  absl::Status RouteLayer(int layer, Activations& act);
  absl::Status CollectLiveRoutes();
  absl::Status RunSwiGluMlp(int layer, const float* x, const int* offsets, int groups, int rows,
                            int64_t weight_stride, int ffn, Activations& act, float* out);
  // y[rows, out] = x · W_gᵀ per group (+ LoRA of `module` when the adapter targets it, keeping
  // its x · Aᵀ in lora_h).
  absl::Status Project(int layer, const char* module, const float* x, const int* offsets,
                       int groups, int rows, int64_t w_stride, int in, int out, float* lora_h,
                       float* y);
  absl::Status Linear(const float* x, const std::string& weight, int rows, int in, int out,
                      float* y, bool accumulate = false);

  absl::Status BackwardLayer(int layer, float* dx);
  absl::Status BackwardAttention(int layer, Activations& act, const float* dmid, float* dnorm1);
  absl::Status BackwardMoeFfn(int layer, Activations& act, const float* dy, float* dnorm2);
  absl::Status BackwardSwiGluMlp(int layer, const float* x, const int* offsets, int groups,
                                 int rows, int64_t weight_stride, int ffn, Activations& act,
                                 const float* dy, float* dx);
  // dx += dy · W_g per group, and the LoRA's gradients of `module` (from the x and lora_h the
  // forward kept).
  absl::Status ProjectBackward(int layer, const char* module, const float* x, const int* offsets,
                               int groups, int rows, int64_t w_stride, int in, int out,
                               const float* lora_h, const float* dy, float* dx);
  // dx += dy · W for a frozen dense weight W [out, in].
  absl::Status LinearBackward(const float* dy, const std::string& weight, int rows, int in, int out,
                              float* dx);
  absl::Status AddGradientsToHost();
  // The device LoRA weights of `module` in `layer` (nullopt when not a target), with gradient
  // pointers into adapter_grads_ when it exists.
  std::optional<LoraProjection> DeviceLora(int layer, const char* module) const;
  const float* Weight(const std::string& name) const;
  // Rounds n activations to bf16 in the bf16 mode, as the CPU Transformer's Round.
  absl::Status Round(float* x, int64_t n) const;

  ModelConfig config_;
  const int device_;  // Made current on every call's thread.
  const Precision precision_;
  const BaseModel& model_;
  LoraAdapter* lora_;
  std::shared_ptr<const DeviceParameters> base_;
  std::unique_ptr<DeviceParameters> adapter_;
  std::unique_ptr<DeviceParameters> adapter_grads_;  // Set by the first Backward.
  // DeviceLora's answers by (layer, module).
  mutable std::map<std::pair<int, std::string>, std::optional<LoraProjection>> device_lora_;
  ::tandem::cuda::DeviceRopeFrequencies rope_;
  std::vector<int> moe_layers_;
  std::vector<int> moe_index_;

  std::unique_ptr<Pass> pass_;
  std::vector<float> logits_, final_hidden_;
  std::vector<int16_t> routes_, live_routes_;
  RoutingStats stats_;
};

}  // namespace tandem::engine::cuda

#endif  // TANDEM_ENGINE_CUDA_CUDA_TRANSFORMER_H_
