#include "services/trainer/update/batch_advantages.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "absl/container/fixed_array.h"
#include "services/trainer/rl/advantages.h"
#include "services/trainer/rl/value_head.h"

namespace tandem::trainer {
namespace {

// Over the masked tokens: their count and the sums of the returns, of their squares, of the
// errors (returns - values) and of theirs -- what ExplainedVariance needs, summable over ranks.
std::array<double, 5> ReturnSums(const std::vector<double>& returns,
                                 const std::vector<double>& values,
                                 const std::vector<double>& mask) {
  std::array<double, 5> sums = {0, 0, 0, 0, 0};
  for (size_t j = 0; j < mask.size(); ++j) {
    if (mask[j] == 0) continue;
    const double error = returns[j] - values[j];
    sums[0] += 1;
    sums[1] += returns[j];
    sums[2] += returns[j] * returns[j];
    sums[3] += error;
    sums[4] += error * error;
  }
  return sums;
}

// 1 - Var(returns - values) / Var(returns) from ReturnSums; 0 when the returns are constant.
double ExplainedVariance(const std::array<double, 5>& sums) {
  const auto [n, sum, sum_sq, error_sum, error_sq] = sums;
  if (n == 0) return 0;
  const double variance = sum_sq / n - (sum / n) * (sum / n);
  const double error_variance = error_sq / n - (error_sum / n) * (error_sum / n);
  return variance > 1e-12 ? 1 - error_variance / variance : 0;
}

}  // namespace

// Whitens the batch's advantages over its masked tokens on every rank.
absl::Status Whiten(TrainingBatch& batch, const GradientSync& sync) {
  auto whitened = WhitenMasked(batch.advantages, batch.mask, [&sync](absl::Span<double> sums) {
    return sync.SumAcrossRanks(sums);
  });
  if (!whitened.ok()) return whitened.status();
  batch.advantages = *std::move(whitened);
  return absl::OkStatus();
}

absl::Status AssignGroupAdvantages(TrainingBatch& batch, GroupBaseline baseline, bool whiten,
                                   const GradientSync& sync) {
  std::vector<double> scores;
  std::vector<int> groups;
  for (const TrainingSample& sample : batch.samples) {
    scores.push_back(sample.reward);
    groups.push_back(sample.group);
  }
  const std::vector<double> advantages = GroupAdvantages(scores, groups, baseline);
  for (size_t j = 0; j < batch.mask.size(); ++j) {
    batch.advantages[j] = batch.mask[j] * advantages[j / batch.cols];
  }
  return whiten ? Whiten(batch, sync) : absl::OkStatus();
}

absl::Status CriticAdvantages(TrainingBatch& batch, const CriticConfig& critic, bool whiten,
                              const GradientSync& sync, UpdateStats& stats) {
  std::vector<double> rewards(batch.mask.size(), 0);
  absl::FixedArray<bool> truncated(batch.rows(), false);
  for (int i = 0; i < batch.rows(); ++i) {
    const TrainingSample& sample = batch.samples[i];
    rewards[batch.at(i, static_cast<int>(sample.response.size()) - 1)] = sample.reward;
    truncated[i] = critic.truncated_gae && sample.truncated;
  }
  GaeResult gae =
      ComputeGae(rewards, batch.old_values, batch.mask, batch.rows(), batch.cols, critic.gamma,
                 critic.lambda, absl::MakeConstSpan(truncated.data(), truncated.size()));
  batch.returns = std::move(gae.returns);
  batch.advantages = std::move(gae.advantages);
  if (whiten) {
    if (absl::Status status = Whiten(batch, sync); !status.ok()) return status;
  }
  std::array<double, 5> sums = ReturnSums(batch.returns, batch.old_values, batch.mask);
  if (absl::Status status = sync.SumAcrossRanks(absl::MakeSpan(sums)); !status.ok()) return status;
  stats.explained_variance = ExplainedVariance(sums);
  return absl::OkStatus();
}

double ValueLoss(const TrainingBatch& batch, int micro, int micro_end, double total_tokens,
                 const CriticConfig& critic, const float* hidden, int d,
                 std::vector<float>& dhidden) {
  ValueHead& head = *critic.head;
  const double clip = critic.value_clip;
  double loss = 0;
  for (int i = micro; i < micro_end; ++i) {
    for (size_t t = 0; t < batch.samples[i].response.size(); ++t) {
      const size_t at = batch.at(i, t);
      const int64_t row = ResponseRow(batch, micro, i, static_cast<int>(t));
      const double value = head.Value(hidden + row * d);
      const double old = batch.old_values[at];
      const double clipped = clip > 0 ? old + std::clamp(value - old, -clip, clip) : value;
      const double error = value - batch.returns[at];
      const double clipped_error = clipped - batch.returns[at];
      // d(0.5 * max(error^2, clipped_error^2)) / dV; the clipped branch is flat outside the clip.
      double dvalue = error;
      if (clipped_error * clipped_error > error * error) {
        loss += 0.5 * clipped_error * clipped_error;
        dvalue = std::abs(value - old) < clip ? clipped_error : 0;
      } else {
        loss += 0.5 * error * error;
      }
      head.Backward(hidden + row * d, critic.loss_coef * dvalue / total_tokens,
                    dhidden.data() + row * d);
    }
  }
  return loss / total_tokens;
}

}  // namespace tandem::trainer
