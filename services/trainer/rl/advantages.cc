#include "services/trainer/rl/advantages.h"

#include <cmath>

#include "absl/container/flat_hash_map.h"

namespace tandem::trainer {

std::vector<double> GroupAdvantages(absl::Span<const double> scores, absl::Span<const int> groups,
                                    GroupBaseline baseline) {
  struct Moments {
    double sum = 0, sum_squares = 0;
    int count = 0;
  };
  absl::flat_hash_map<int, Moments> moments;
  for (size_t i = 0; i < scores.size(); ++i) {
    Moments& group = moments[groups[i]];
    group.sum += scores[i];
    group.sum_squares += scores[i] * scores[i];
    ++group.count;
  }
  std::vector<double> advantages(scores.size());
  for (size_t i = 0; i < scores.size(); ++i) {
    const Moments& group = moments[groups[i]];
    double mean = 0, std = 1;
    if (group.count > 1) {
      mean = group.sum / group.count;
      const double variance =
          std::max(0.0, (group.sum_squares - group.count * mean * mean) / (group.count - 1));
      std = std::sqrt(variance);
    }
    advantages[i] =
        baseline == GroupBaseline::kGrpo ? (scores[i] - mean) / (std + 1e-6) : scores[i] - mean;
  }
  return advantages;
}

GaeResult ComputeGae(absl::Span<const double> rewards, absl::Span<const double> values,
                     absl::Span<const double> mask, int rows, int cols, double gamma, double lambda,
                     absl::Span<const bool> truncated) {
  GaeResult result;
  result.advantages.assign(static_cast<size_t>(rows) * cols, 0);
  result.returns.assign(result.advantages.size(), 0);
  for (int b = 0; b < rows; ++b) {
    const size_t row = static_cast<size_t>(b) * cols;
    double next_value = 0, last = 0;
    if (!truncated.empty() && truncated[b]) {
      for (int t = cols - 1; t >= 0; --t) {
        if (mask[row + t] > 0) {
          next_value = values[row + t];
          break;
        }
      }
    }
    for (int t = cols - 1; t >= 0; --t) {
      const double m = mask[row + t], v = values[row + t];
      const double delta = rewards[row + t] + gamma * next_value - v;
      const double advantage = delta + gamma * lambda * last;
      next_value = m * v + (1 - m) * next_value;
      last = m * advantage + (1 - m) * last;
      result.advantages[row + t] = last;
      result.returns[row + t] = last + v;
    }
  }
  return result;
}

std::vector<double> WhitenMasked(absl::Span<const double> values, absl::Span<const double> mask) {
  return *WhitenMasked(values, mask, [](absl::Span<double>) { return absl::OkStatus(); });
}

absl::StatusOr<std::vector<double>> WhitenMasked(absl::Span<const double> values,
                                                 absl::Span<const double> mask,
                                                 const SumOverRanks& sum_over_ranks) {
  double sums[2] = {0, 0};  // Count, sum.
  for (size_t i = 0; i < values.size(); ++i) {
    sums[0] += mask[i];
    sums[1] += mask[i] * values[i];
  }
  if (absl::Status status = sum_over_ranks(sums); !status.ok()) return status;
  const double count = sums[0];
  const double mean = sums[1] / (count + 1e-8);
  double squares = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    squares += mask[i] * (values[i] - mean) * (values[i] - mean);
  }
  if (absl::Status status = sum_over_ranks(absl::MakeSpan(&squares, 1)); !status.ok()) {
    return status;
  }
  double variance = squares / (count + 1e-8);
  if (count > 1) variance *= count / (count - 1);
  std::vector<double> whitened(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    whitened[i] = (values[i] - mean) / std::sqrt(variance + 1e-8);
  }
  return whitened;
}

}  // namespace tandem::trainer
