#include "services/trainer/rl/policy_loss.h"

#include <algorithm>
#include <cmath>

namespace tandem::trainer {
namespace {

// The weight each token's loss gets in the aggregate: token-mean 1/sum(m); seq-mean-token-sum
// 1/B; seq-mean-token-mean 1/(B * sum_t m of its row).
std::vector<double> AggregationScales(absl::Span<const double> mask, int rows, int cols,
                                      Aggregation aggregation, double total_tokens,
                                      int total_rows) {
  std::vector<double> scale(mask.size(), 0);
  double total = total_tokens;
  if (total == 0) {
    for (double m : mask) total += m;
  }
  const int batch_rows = total_rows > 0 ? total_rows : rows;
  for (int b = 0; b < rows; ++b) {
    double row_tokens = 0;
    for (int t = 0; t < cols; ++t) row_tokens += mask[static_cast<size_t>(b) * cols + t];
    for (int t = 0; t < cols; ++t) {
      const size_t i = static_cast<size_t>(b) * cols + t;
      switch (aggregation) {
        case Aggregation::kTokenMean:
          scale[i] = total > 0 ? mask[i] / total : 0;
          break;
        case Aggregation::kSeqMeanTokenSum:
          scale[i] = mask[i] / batch_rows;
          break;
        case Aggregation::kSeqMeanTokenMean:
          scale[i] = row_tokens > 0 ? mask[i] / (batch_rows * row_tokens) : 0;
          break;
      }
    }
  }
  return scale;
}

}  // namespace

double KlEstimate(double d, KlEstimator estimator) {
  switch (estimator) {
    case KlEstimator::kK1:
      return d;
    case KlEstimator::kK2:
      return 0.5 * d * d;
    case KlEstimator::kK3:
      d = std::clamp(d, -20.0, 20.0);
      return std::exp(-d) + d - 1;
  }
  return 0;
}

double KlEstimateGradient(double d, KlEstimator estimator) {
  switch (estimator) {
    case KlEstimator::kK1:
      return 1;
    case KlEstimator::kK2:
      return d;
    case KlEstimator::kK3:
      return (d < -20 || d > 20) ? 0 : 1 - std::exp(-d);
  }
  return 0;
}

PolicyLossResult ComputePolicyLoss(const PolicyLossInputs& in, const PolicyLossConfig& config) {
  const std::vector<double> scale = AggregationScales(in.mask, in.rows, in.cols, config.aggregation,
                                                      in.total_tokens, in.total_rows);
  PolicyLossResult result;
  result.dlogp.assign(scale.size(), 0);
  double tokens = 0, clipped = 0, kl_sum = 0;
  for (size_t i = 0; i < scale.size(); ++i) {
    if (in.mask[i] <= 0) continue;
    ++tokens;
    const double w = in.weights.empty() ? 1 : in.weights[i];
    const double a = in.advantages[i];
    const double log_ratio = in.logp[i] - in.old_logp[i];
    const bool ratio_saturated = log_ratio < -20 || log_ratio > 20;
    const double ratio = std::exp(std::clamp(log_ratio, -20.0, 20.0));
    const double clipped_ratio = std::clamp(ratio, 1 - config.clip_low, 1 + config.clip_high);
    const double unclipped_loss = -a * ratio, clipped_loss = -a * clipped_ratio;
    double loss = std::max(unclipped_loss, clipped_loss);
    // The unclipped term carries the gradient only when it is the one max() picked.
    bool gradient_flows = unclipped_loss >= clipped_loss && !ratio_saturated;
    if (config.dual_clip_c > 0 && a < 0 && loss > -a * config.dual_clip_c) {
      loss = -a * config.dual_clip_c;
      gradient_flows = false;
    }
    clipped += !gradient_flows;
    double token_loss = w * loss;
    double gradient = gradient_flows ? w * unclipped_loss : 0;  // d(-a*ratio)/dlogp = -a*ratio
    if (config.kl_coef > 0 && !in.ref_logp.empty()) {
      const double d = in.logp[i] - in.ref_logp[i];
      const double kl = KlEstimate(d, config.kl_estimator);
      kl_sum += kl;
      token_loss += config.kl_coef * kl;
      gradient += config.kl_coef * KlEstimateGradient(d, config.kl_estimator);
    }
    result.loss += scale[i] * token_loss;
    result.dlogp[i] = scale[i] * gradient;
  }
  result.clip_share = tokens > 0 ? clipped / tokens : 0;
  result.ref_kl = tokens > 0 ? kl_sum / tokens : 0;
  return result;
}

}  // namespace tandem::trainer
