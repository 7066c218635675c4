#ifndef TANDEM_SERVICES_TRAINER_UPDATE_UPDATE_STATISTICS_H_
#define TANDEM_SERVICES_TRAINER_UPDATE_UPDATE_STATISTICS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "engine/transformer.h"
#include "services/trainer/rl/mismatch_correction.h"
#include "services/trainer/update/gradient_sync.h"
#include "services/trainer/update/training_batch.h"

namespace tandem::trainer {

struct UpdateStats {
  double loss = 0;           // Mean over mini-batches.
  double grad_norm = 0;      // Of the last mini-batch, before clipping.
  double learning_rate = 0;  // Of the last update.
  double ppo_clip_share = 0;
  double ref_kl = 0;
  double is_ess = 1;
  double is_clipped_share = 0;
  double mismatch_kl_k3 = 0;  // Mean over response tokens of k3(rollout || trainer old policy).
  // Share of response tokens with |logp_old - logp_rollout| > 1.
  double large_mismatch_share = 0;
  // With a critic: the value loss (mean over mini-batches, before loss_coef), and the share of
  // the returns' variance the old values explain, 1 - Var(R - V_old) / Var(R) over tokens.
  double value_loss = 0;
  double explained_variance = 0;
  // The trainer's live routing of the response tokens against the rollout's routes in the
  // old-policy pass; zeros when no rollout routes were given.
  engine::RoutingStats routing;
  int64_t response_tokens = 0;
};

// Adds live routes against recorded ones to `stats`, as the engine counts replay disagreement:
// per token x MoE layer, whether the top-k sets differ; recorded rows of -1 (never forwarded)
// are not compared.
void CompareRoutes(const int16_t* live, const int16_t* recorded, int64_t tokens, int layers,
                   int top_k, engine::RoutingStats& stats);

// Samples [begin, end)'s mismatch between the rollout's log-probs and the old policy's (just
// recorded in the batch): their k3 KL and share of large gaps into `stats`, and the correction
// weights and mask `is` gives them into the batch.
void RecordMismatch(TrainingBatch& batch, int begin, int end, const IsConfig& is,
                    UpdateStats& stats);

// The step's statistics over every rank's share (summed through `sync`), normalized by the
// batch's tokens; `loss` is this rank's sum over its `updates` mini-batches.
absl::Status SumUpdateStats(const TrainingBatch& batch, double loss, int updates,
                            const GradientSync& sync, UpdateStats& stats);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_UPDATE_UPDATE_STATISTICS_H_
