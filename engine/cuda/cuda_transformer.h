#ifndef TANDEM_ENGINE_CUDA_CUDA_TRANSFORMER_H_
#define TANDEM_ENGINE_CUDA_CUDA_TRANSFORMER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/cuda/device_parameters.h"
#include "engine/model.h"
#include "engine/transformer.h"
#include "kernels/cuda/rope.h"

namespace tandem::engine::cuda {

// The Transformer's full-sequence forward on a GPU: the same model, adapter, routing (live,
// replayed, or live where a replayed row is -1) and results as engine::Transformer in fp32,
// computed by the kernels/cuda twins. The base model is uploaded once; the adapter again on
// RefreshAdapter (a refit).
//
// Not yet on the GPU (UNIMPLEMENTED from Create): latent attention, and every precision but
// fp32. Backward and the KV-cache decode are later work (see issue 18's notes).
class CudaTransformer {
 public:
  // Neither is owned; both must outlive this object; lora may be null. Selects GPU `device`
  // for the calling thread: FAILED_PRECONDITION without it, RESOURCE_EXHAUSTED when the
  // weights do not fit.
  static absl::StatusOr<std::unique_ptr<CudaTransformer>> Create(const BaseModel& model,
                                                                 LoraAdapter* lora, int device = 0);

  // Copies the adapter's (changed) tensors to the GPU.
  absl::Status RefreshAdapter();

  // Same contract as Transformer::Forward; the logits are copied to the host once.
  absl::StatusOr<const float*> Forward(const TokenBatch& batch,
                                       const std::vector<int16_t>* replay = nullptr);

  const std::vector<int16_t>& routes() const { return routes_; }
  const std::vector<int16_t>& live_routes() const { return live_routes_; }
  const RoutingStats& routing_stats() const { return stats_; }
  const ModelConfig& config() const { return config_; }

 private:
  struct Pass;  // One Forward's device buffers and bookkeeping.

  CudaTransformer(const BaseModel& model, LoraAdapter* lora, DeviceParameters base,
                  std::unique_ptr<DeviceParameters> adapter,
                  ::tandem::cuda::DeviceRopeFrequencies rope);

  absl::Status RunLayer(int layer, Pass& pass);
  absl::Status RunAttention(int layer, Pass& pass);
  absl::Status NormalizeQk(const std::string& weight, int heads, const float* raw, int rows,
                           float* out);
  absl::Status RunMoeFfn(int layer, Pass& pass);
  absl::Status RouteLayer(int moe_index, const float* scores, const float* bias, Pass& pass,
                          int16_t* ids);
  absl::Status RunSwiGluMlp(int layer, const float* x, const int* offsets, int groups, int rows,
                            int64_t weight_stride, int ffn, Pass& pass, float* out);
  // y[rows, out] = x · W_gᵀ per group (+ LoRA of `module` when the adapter targets it).
  absl::Status Project(int layer, const char* module, const float* x, const int* offsets,
                       int groups, int rows, int64_t w_stride, int in, int out, Pass& pass,
                       float* y);
  absl::Status Linear(const float* x, const std::string& weight, int rows, int in, int out,
                      Pass& pass, float* y, bool accumulate = false);
  const float* Weight(const std::string& name) const;

  ModelConfig config_;
  const BaseModel& model_;
  LoraAdapter* lora_;
  DeviceParameters base_;
  std::unique_ptr<DeviceParameters> adapter_;
  ::tandem::cuda::DeviceRopeFrequencies rope_;
  std::vector<int> moe_layers_;
  std::vector<int> moe_index_;

  std::vector<float> logits_;
  std::vector<int16_t> routes_, live_routes_;
  RoutingStats stats_;
};

}  // namespace tandem::engine::cuda

#endif  // TANDEM_ENGINE_CUDA_CUDA_TRANSFORMER_H_
