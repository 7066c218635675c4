#ifndef TANDEM_SERVICES_TRAINER_UPDATE_TRAINING_BATCH_H_
#define TANDEM_SERVICES_TRAINER_UPDATE_TRAINING_BATCH_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/transformer.h"
#include "services/trainer/update/forward_backward.h"

namespace tandem::trainer {

// One scored rollout sample the policy learns from.
struct TrainingSample {
  std::vector<int> prompt;
  std::vector<int> response;            // Generated tokens.
  std::vector<float> rollout_logprobs;  // Per response token, from the rollout.
  int group = 0;                        // The prompt it answers.
  double reward = 0;
  bool truncated = false;  // Stopped at max_new_tokens: PPO's truncated GAE bootstraps it.
};

// One update's samples laid out for its passes: per-token values B samples x cols (the longest
// response) wide, and each sample's place in the packed sequences the engine forwards.
struct TrainingBatch {
  const std::vector<TrainingSample>& samples;
  const std::vector<int16_t>* rollout_routes = nullptr;  // Null when none were fetched.
  std::vector<int64_t> offsets;  // Token offset of each sample's sequence; size n + 1.
  int cols = 0;                  // Longest response.
  int route_width = 0;           // MoE layers x top_k.
  std::vector<double> mask, advantages, rollout_logp, old_logp;  // B x cols
  std::vector<double> old_values, returns;                       // B x cols, with a critic
  std::vector<bool> have_old;                                    // Per sample: old_logp filled.
  std::vector<int16_t> old_routes;       // R2: the old-policy pass's live routes.
  std::vector<double> weights, is_mask;  // Mismatch weights and mask after rejection.
  double is_affected = 0;                // Tokens whose weight was clipped, zeroed or rejected.

  int rows() const { return static_cast<int>(samples.size()); }
  size_t at(int sample, int t) const { return static_cast<size_t>(sample) * cols + t; }
};

// INVALID_ARGUMENT for samples an update cannot train on; `route_width` ids per token when
// `rollout_routes` is not empty.
absl::Status CheckSamples(const std::vector<TrainingSample>& samples,
                          const std::vector<int16_t>& rollout_routes, int route_width);

// The batch of (checked) `samples` and their `rollout_routes` (empty: none): offsets, the mask
// and the rollout's log-probs filled; advantages and old log-probs 0, mismatch weights 1.
TrainingBatch MakeTrainingBatch(const std::vector<TrainingSample>& samples,
                                const std::vector<int16_t>& rollout_routes, int route_width);

// Row of the hidden state (and logits) that predicts response token t of sample i, counted from
// sample `begin`'s first token.
int64_t ResponseRow(const TrainingBatch& batch, int begin, int i, int t);
// Samples [begin, end) as packed sequences (prompt then response), and the token each row
// predicts: the response token at ResponseRow, -1 elsewhere.
engine::TokenBatch Sequences(const TrainingBatch& batch, int begin, int end);
std::vector<int> ResponseTargets(const TrainingBatch& batch, int begin, int end);
// A value per row of samples [begin, end) (as Sequences packs them) as B x cols values of their
// response tokens, 0 past each response.
std::vector<double> ResponseValues(const TrainingBatch& batch, int begin, int end,
                                   const std::vector<float>& rows);
// The inverse: B x cols values of the response tokens of samples [begin, end) as a value per
// row (at ResponseRow), 0 at rows that predict no response token.
std::vector<float> PositionValues(const TrainingBatch& batch, int begin, int end,
                                  const std::vector<double>& values);

// Samples [begin, end) to score: their Sequences, ResponseTargets and slice of `routes` (null or
// empty: none, routed live).
struct MicroBatch {
  engine::TokenBatch sequences;
  std::vector<int> targets;
  std::vector<int16_t> routes;

  ScoredSequences Scored(float temperature) const;  // Valid while this lives.
};
MicroBatch MicroBatchOf(const TrainingBatch& batch, int begin, int end,
                        const std::vector<int16_t>* routes);

// Micro-batches of `micro_batch_size` samples in `rows` samples.
inline int MicroBatches(int rows, int micro_batch_size) {
  return (rows + micro_batch_size - 1) / micro_batch_size;
}

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_UPDATE_TRAINING_BATCH_H_
