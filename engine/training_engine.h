#ifndef TANDEM_ENGINE_TRAINING_ENGINE_H_
#define TANDEM_ENGINE_TRAINING_ENGINE_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/config.h"
#include "engine/model.h"
#include "engine/transformer.h"

namespace tandem::engine {

// What training needs of a model, wherever it computes: a full-sequence forward (with replayed
// routes), a backward into the adapter's host gradients, and the routing it used. The adapter's
// host tensors stay the source of truth: after they change (an optimizer step, a checkpoint
// load), AdapterChanged makes the engine compute with the new values.
class TrainingEngine {
 public:
  virtual ~TrainingEngine() = default;

  // Transformer::Forward's contract.
  virtual absl::StatusOr<const float*> Forward(const TokenBatch& batch,
                                               const std::vector<int16_t>* replay) = 0;
  // Transformer::Backward's contract; an engine that can fail says why.
  virtual absl::Status Backward(const float* dlogits, const float* dhidden) = 0;
  // Transformer::ForwardLogProbs' and BackwardLogProbs' contracts: training without the
  // whole-vocabulary logits.
  virtual absl::StatusOr<std::vector<float>> ForwardLogProbs(const TokenBatch& batch,
                                                             const std::vector<int16_t>* replay,
                                                             const std::vector<int>& targets,
                                                             float temperature) = 0;
  virtual absl::Status BackwardLogProbs(const float* dlogp, const float* dhidden) = 0;
  virtual absl::Status AdapterChanged() = 0;

  virtual const std::vector<int16_t>& routes() const = 0;
  virtual const std::vector<int16_t>& live_routes() const = 0;
  virtual const RoutingStats& routing_stats() const = 0;
  virtual const std::vector<float>& final_hidden() const = 0;
};

// The Transformer as a TrainingEngine, over the backend the caller chose (the CPU kernels, which
// read the adapter's host tensors in place; a GPU's, which mirror them).
class TransformerTrainingEngine : public TrainingEngine {
 public:
  // None is owned; lora and exchange may be null (Transformer's constructor says what they and
  // ops are).
  TransformerTrainingEngine(BaseModel& model, LoraAdapter* lora, std::unique_ptr<ModelOps> ops,
                            ExpertExchange* exchange = nullptr)
      : transformer_(model, lora, std::move(ops), Precision::kF32, exchange) {}

  absl::StatusOr<const float*> Forward(const TokenBatch& batch,
                                       const std::vector<int16_t>* replay) override {
    return transformer_.Forward(batch, replay);
  }
  absl::Status Backward(const float* dlogits, const float* dhidden) override {
    return transformer_.Backward(dlogits, dhidden);
  }
  absl::StatusOr<std::vector<float>> ForwardLogProbs(const TokenBatch& batch,
                                                     const std::vector<int16_t>* replay,
                                                     const std::vector<int>& targets,
                                                     float temperature) override {
    return transformer_.ForwardLogProbs(batch, replay, targets, temperature);
  }
  absl::Status BackwardLogProbs(const float* dlogp, const float* dhidden) override {
    return transformer_.BackwardLogProbs(dlogp, dhidden);
  }
  absl::Status AdapterChanged() override { return transformer_.AdapterChanged(); }

  const std::vector<int16_t>& routes() const override { return transformer_.routes(); }
  const std::vector<int16_t>& live_routes() const override { return transformer_.live_routes(); }
  const RoutingStats& routing_stats() const override { return transformer_.routing_stats(); }
  const std::vector<float>& final_hidden() const override { return transformer_.final_hidden(); }

 private:
  Transformer transformer_;
};

// A trainer's two engines: the policy (base model + adapter) and the reference (the base model
// alone, for the KL penalty).
struct TrainingEngines {
  std::unique_ptr<TrainingEngine> policy;
  std::unique_ptr<TrainingEngine> reference;
};

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_TRAINING_ENGINE_H_
