#include "services/trainer/step/step_metrics.h"

#include <algorithm>

namespace tandem::trainer {

std::vector<float> TalliesOf(const StepSamples& samples, int64_t missing_route_entries,
                             int64_t route_entries, ExpertWork experts) {
  std::vector<float> tally(kTallies, 0);
  tally[kSamples] = static_cast<float>(samples.training.size());
  for (const TrainingSample& sample : samples.training) {
    tally[kResponseTokens] += static_cast<float>(sample.response.size());
  }
  tally[kCorrect] = static_cast<float>(samples.correct);
  tally[kReward] = static_cast<float>(samples.reward);
  tally[kLength] = static_cast<float>(samples.length);
  tally[kTruncated] = static_cast<float>(samples.truncated);
  tally[kPartial] = static_cast<float>(samples.partial);
  tally[kMissingRouteEntries] = static_cast<float>(missing_route_entries);
  tally[kRouteEntries] = static_cast<float>(route_entries);
  tally[kExpertRows] = static_cast<float>(experts.rows);
  tally[kExpertSeconds] = static_cast<float>(experts.seconds);
  return tally;
}

void SetSampleMetrics(const std::vector<float>& tallies, trainer::v1::StepMetrics& metrics) {
  std::vector<double> sums(kTallies, 0);
  for (size_t rank = 0; rank * kTallies < tallies.size(); ++rank) {
    const float* tally = tallies.data() + rank * kTallies;
    for (int t = 0; t < kTallies; ++t) sums[t] += tally[t];
    trainer::v1::RankShare& share = *metrics.add_ranks();
    share.set_rank(static_cast<int>(rank));
    share.set_samples(static_cast<int64_t>(tally[kSamples]));
    share.set_response_tokens(static_cast<int64_t>(tally[kResponseTokens]));
    share.set_expert_rows(static_cast<int64_t>(tally[kExpertRows]));
    share.set_expert_seconds(tally[kExpertSeconds]);
  }
  const double samples = std::max(1.0, sums[kSamples]);
  metrics.set_accuracy(sums[kCorrect] / samples);
  metrics.set_reward_mean(sums[kReward] / samples);
  metrics.set_response_length_mean(sums[kLength] / samples);
  metrics.set_truncated_share(sums[kTruncated] / samples);
  metrics.set_partial_rollout_share(sums[kPartial] / samples);
  metrics.set_missing_route_share(
      sums[kRouteEntries] > 0 ? sums[kMissingRouteEntries] / sums[kRouteEntries] : 0);
}

void SetUpdateMetrics(const UpdateStats& stats, trainer::v1::StepMetrics& metrics) {
  metrics.set_routing_disagreement_token_layer(stats.routing.decision_disagreement());
  metrics.set_routing_disagreement_token(stats.routing.token_disagreement());
  metrics.set_mismatch_kl_k3(stats.mismatch_kl_k3);
  metrics.set_large_mismatch_share(stats.large_mismatch_share);
  metrics.set_is_weight_ess(stats.is_ess);
  metrics.set_is_clipped_share(stats.is_clipped_share);
  metrics.set_ppo_clip_share(stats.ppo_clip_share);
  metrics.set_ref_kl(stats.ref_kl);
  metrics.set_loss(stats.loss);
  metrics.set_value_loss(stats.value_loss);
  metrics.set_explained_variance(stats.explained_variance);
  metrics.set_grad_norm(stats.grad_norm);
  metrics.set_learning_rate(stats.learning_rate);
  metrics.set_response_tokens(stats.response_tokens);
}

}  // namespace tandem::trainer
