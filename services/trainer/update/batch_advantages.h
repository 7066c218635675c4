#ifndef TANDEM_SERVICES_TRAINER_UPDATE_BATCH_ADVANTAGES_H_
#define TANDEM_SERVICES_TRAINER_UPDATE_BATCH_ADVANTAGES_H_

#include <vector>

#include "absl/status/status.h"
#include "services/trainer/rl/advantages.h"
#include "services/trainer/update/gradient_sync.h"
#include "services/trainer/update/policy_update_config.h"
#include "services/trainer/update/training_batch.h"
#include "services/trainer/update/update_statistics.h"

namespace tandem::trainer {

// A batch's advantages without a critic (GRPO, Dr.GRPO): each sample's score against its
// group's baseline, on every response token, whitened (`whiten`, over every rank through `sync`).
absl::Status AssignGroupAdvantages(TrainingBatch& batch, GroupBaseline baseline, bool whiten,
                                   const GradientSync& sync);

// PPO's advantages from the critic: token rewards (the score at each sample's last token), GAE
// over the batch's old values, returns, whitening (`whiten`, over every rank through `sync`)
// and the explained variance into `stats`.
absl::Status CriticAdvantages(TrainingBatch& batch, const CriticConfig& critic, bool whiten,
                              const GradientSync& sync, UpdateStats& stats);

// Adds the clipped value loss of samples [micro, micro_end) to the value head's gradients and to
// `dhidden`, from `hidden` (the forward's final hidden states, `d` wide, rows as Sequences packs
// them); returns its token-mean share over `total_tokens`.
double ValueLoss(const TrainingBatch& batch, int micro, int micro_end, double total_tokens,
                 const CriticConfig& critic, const float* hidden, int d,
                 std::vector<float>& dhidden);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_UPDATE_BATCH_ADVANTAGES_H_
