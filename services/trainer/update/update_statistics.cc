#include "services/trainer/update/update_statistics.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "services/trainer/rl/mismatch_correction.h"
#include "services/trainer/rl/policy_loss.h"

namespace tandem::trainer {

void CompareRoutes(const int16_t* live, const int16_t* recorded, int64_t tokens, int layers,
                   int top_k, engine::RoutingStats& stats) {
  for (int64_t t = 0; t < tokens; ++t) {
    bool token_compared = false, token_differs = false;
    for (int l = 0; l < layers; ++l) {
      const int64_t row = (t * layers + l) * top_k;
      if (recorded[row] < 0) continue;
      ++stats.decisions;
      token_compared = true;
      if (!engine::SameExpertSet(live + row, recorded + row, top_k)) {
        ++stats.differing_decisions;
        token_differs = true;
      }
    }
    stats.tokens += token_compared;
    stats.differing_tokens += token_differs;
  }
}

void RecordMismatch(TrainingBatch& batch, int begin, int end, const IsConfig& is,
                    UpdateStats& stats) {
  const size_t first = batch.at(begin, 0), count = batch.at(end, 0) - first;
  std::vector<double> log_ratio(count);
  for (size_t j = 0; j < count; ++j) {
    log_ratio[j] = batch.old_logp[first + j] - batch.rollout_logp[first + j];
    if (batch.mask[first + j] > 0) {
      stats.mismatch_kl_k3 += KlEstimate(-log_ratio[j], KlEstimator::kK3);
      stats.large_mismatch_share += std::abs(log_ratio[j]) > 1 ? 1 : 0;
    }
  }
  const IsWeights weights =
      ComputeIsWeights(log_ratio, absl::MakeConstSpan(batch.mask).subspan(first, count),
                       end - begin, batch.cols, is);
  std::copy(weights.weights.begin(), weights.weights.end(), batch.weights.begin() + first);
  std::copy(weights.mask.begin(), weights.mask.end(), batch.is_mask.begin() + first);
  double tokens = 0;
  for (size_t j = 0; j < count; ++j) tokens += batch.mask[first + j];
  batch.is_affected += weights.clipped_share * tokens;
}

absl::Status SumUpdateStats(const TrainingBatch& batch, double loss, int updates,
                            const GradientSync& sync, UpdateStats& stats) {
  double weights[3] = {0, 0, 0};  // Count, sum and sum of squares of the kept tokens' weights.
  for (size_t j = 0; j < batch.weights.size(); ++j) {
    if (batch.is_mask[j] <= 0) continue;
    weights[0] += 1;
    weights[1] += batch.weights[j];
    weights[2] += batch.weights[j] * batch.weights[j];
  }
  engine::RoutingStats& routing = stats.routing;
  // Each rank's loss terms are already normalized by the batch's tokens: they add up.
  double sums[] = {loss,
                   stats.value_loss,
                   stats.ppo_clip_share,
                   stats.ref_kl,
                   stats.mismatch_kl_k3,
                   stats.large_mismatch_share,
                   batch.is_affected,
                   static_cast<double>(stats.response_tokens),
                   static_cast<double>(routing.decisions),
                   static_cast<double>(routing.differing_decisions),
                   static_cast<double>(routing.tokens),
                   static_cast<double>(routing.differing_tokens),
                   weights[0],
                   weights[1],
                   weights[2]};
  if (absl::Status status = sync.SumAcrossRanks(sums); !status.ok()) return status;
  const double tokens = std::max(sums[7], 1.0);
  stats.loss = sums[0] / updates;
  stats.value_loss = sums[1] / updates;
  stats.ppo_clip_share = sums[2] / tokens;
  stats.ref_kl = sums[3] / tokens;
  stats.mismatch_kl_k3 = sums[4] / tokens;
  stats.large_mismatch_share = sums[5] / tokens;
  stats.is_clipped_share = sums[6] / tokens;
  stats.response_tokens = static_cast<int64_t>(sums[7]);
  routing.decisions = static_cast<int64_t>(sums[8]);
  routing.differing_decisions = static_cast<int64_t>(sums[9]);
  routing.tokens = static_cast<int64_t>(sums[10]);
  routing.differing_tokens = static_cast<int64_t>(sums[11]);
  stats.is_ess = EffectiveSampleSize(sums[12], sums[13], sums[14]);
  return absl::OkStatus();
}

}  // namespace tandem::trainer
