#include "services/trainer/rl/mismatch_correction.h"

#include <algorithm>
#include <cmath>

namespace tandem::trainer {
namespace {

// Per row: the sum (sequence TIS) or mean (sequence rejection) of m * log rho.
std::vector<double> RowLogRatios(absl::Span<const double> log_ratio, absl::Span<const double> mask,
                                 int rows, int cols, bool mean) {
  std::vector<double> per_row(rows, 0);
  for (int b = 0; b < rows; ++b) {
    double sum = 0, count = 0;
    for (int t = 0; t < cols; ++t) {
      const size_t i = static_cast<size_t>(b) * cols + t;
      sum += mask[i] * log_ratio[i];
      count += mask[i];
    }
    per_row[b] = mean ? (count > 0 ? sum / count : 0) : sum;
  }
  return per_row;
}

}  // namespace

double EffectiveSampleSize(absl::Span<const double> weights, absl::Span<const double> mask) {
  double count = 0, sum = 0, sum_squares = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (mask[i] <= 0) continue;
    count += 1;
    sum += weights[i];
    sum_squares += weights[i] * weights[i];
  }
  return EffectiveSampleSize(count, sum, sum_squares);
}

double EffectiveSampleSize(double count, double sum, double sum_squares) {
  if (count == 0 || sum <= 0) return 1;
  const double mean = sum / count;
  // 1 / mean((w / mean)^2) = count * mean^2 / sum(w^2).
  return count * mean * mean / sum_squares;
}

IsWeights ComputeIsWeights(absl::Span<const double> log_ratio, absl::Span<const double> mask,
                           int rows, int cols, const IsConfig& config) {
  const size_t size = static_cast<size_t>(rows) * cols;
  IsWeights result;
  result.weights.assign(size, 1);
  result.mask.assign(mask.begin(), mask.end());
  if (config.mode == IsMode::kNone) return result;
  const bool sequence =
      config.mode == IsMode::kSequenceTis ||
      (config.mode == IsMode::kRejection && config.level == RejectionLevel::kSequence);
  const std::vector<double> row_log_ratio =
      sequence
          ? RowLogRatios(log_ratio, mask, rows, cols, /*mean=*/config.mode == IsMode::kRejection)
          : std::vector<double>();
  double affected = 0, count = 0;
  for (int b = 0; b < rows; ++b) {
    for (int t = 0; t < cols; ++t) {
      const size_t i = static_cast<size_t>(b) * cols + t;
      if (mask[i] <= 0) continue;
      ++count;
      const double token_ratio = std::exp(std::clamp(log_ratio[i], -20.0, 20.0));
      double& weight = result.weights[i];
      bool changed = false;
      switch (config.mode) {
        case IsMode::kTokenTis:
          weight = std::min(token_ratio, config.upper);
          changed = token_ratio > config.upper;
          break;
        case IsMode::kSequenceTis: {
          const double ratio = std::exp(std::clamp(row_log_ratio[b], -20.0, 20.0));
          weight = std::min(ratio, config.upper);
          changed = ratio > config.upper;
          break;
        }
        case IsMode::kIcePop:
          changed = token_ratio < config.lower || token_ratio > config.upper;
          weight = changed ? 0 : token_ratio;
          break;
        case IsMode::kRejection: {
          const double ratio = sequence ? std::exp(row_log_ratio[b]) : token_ratio;
          changed = ratio < config.lower || ratio > config.upper;
          weight = 1;
          if (changed) result.mask[i] = 0;
          break;
        }
        case IsMode::kNone:
          break;
      }
      affected += changed;
    }
  }
  result.clipped_share = count > 0 ? affected / count : 0;
  result.ess = EffectiveSampleSize(result.weights, result.mask);
  return result;
}

}  // namespace tandem::trainer
