#ifndef TANDEM_SERVICES_TRAINER_UPDATE_FORWARD_BACKWARD_H_
#define TANDEM_SERVICES_TRAINER_UPDATE_FORWARD_BACKWARD_H_

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "engine/training_engine.h"

namespace tandem::trainer {

// One batch of token sequences to score: the token each position predicts (-1: none), the routes
// to replay ([tokens, MoE layers, top_k]; null: route live) and the sampling temperature.
struct ScoredSequences {
  const engine::TokenBatch* sequences = nullptr;
  const std::vector<int>* targets = nullptr;
  const std::vector<int16_t>* routes = nullptr;
  float temperature = 1;
};

// A loss on a forward's per-position log-probs: its value, its gradient with respect to each
// log-prob (one per position; positions without a target are ignored) and, when it also reads
// the final hidden states (a critic), its gradient with respect to them ([positions, d_model];
// empty: none).
struct TokenLoss {
  double value = 0;
  std::vector<float> dlogp;
  std::vector<float> dhidden;
};
using TokenLossFunction =
    absl::FunctionRef<absl::StatusOr<TokenLoss>(const std::vector<float>& logp)>;

// The training primitive under every objective (the primitive API's forward_backward): a forward
// of `engine` over `batch` to per-position log-probs, `loss` on them (which may read the
// engine's routes and final hidden states, or run other engines), and the backward of its
// gradient into every parameter whose gradients are enabled, where they add to what is there.
// Returns the loss's value. The engine's errors, the loss's, and INVALID_ARGUMENT for a gradient
// that is not one per position.
absl::StatusOr<double> ForwardBackward(engine::TrainingEngine& engine, const ScoredSequences& batch,
                                       TokenLossFunction loss);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_UPDATE_FORWARD_BACKWARD_H_
