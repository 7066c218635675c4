#ifndef TANDEM_SERVICES_TRAINER_ADVANTAGES_H_
#define TANDEM_SERVICES_TRAINER_ADVANTAGES_H_

#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

// Advantage estimators, with veRL's semantics (docs/trainer.md, "A step"). Per-token arrays
// are B x T row-major with a response mask m (1 for response tokens, 0 for padding).
namespace tandem::trainer {

enum class GroupBaseline {
  kGrpo,    // (s - mean) / (std_unbiased + 1e-6)
  kDrGrpo,  // s - mean
};

// One advantage per sample from its score and its group (the prompt it answers). A group of one
// uses mean 0 and std 1.
std::vector<double> GroupAdvantages(absl::Span<const double> scores, absl::Span<const int> groups,
                                    GroupBaseline baseline);

struct GaeResult {
  std::vector<double> advantages;  // B x T
  std::vector<double> returns;     // advantages + values, before any whitening
};

// Generalized advantage estimation, backwards over t. `truncated` (may be empty: none) marks rows
// cut off at max_new_tokens: their recursion starts from the value of their last response token
// instead of 0 (truncated GAE).
GaeResult ComputeGae(absl::Span<const double> rewards, absl::Span<const double> values,
                     absl::Span<const double> mask, int rows, int cols, double gamma, double lambda,
                     absl::Span<const bool> truncated = {});

// Sums partial statistics in place over every data-parallel rank holding a share of the batch
// (the identity on one rank).
using SumOverRanks = std::function<absl::Status(absl::Span<double>)>;

// Masked whitening over the whole batch with the unbiased variance: (x - mean) / sqrt(var + 1e-8).
std::vector<double> WhitenMasked(absl::Span<const double> values, absl::Span<const double> mask);
// The same over a batch whose shares are spread over ranks: `values` and `mask` are this rank's
// share, the mean and variance the whole batch's (its sums combined by `sum_over_ranks`).
absl::StatusOr<std::vector<double>> WhitenMasked(absl::Span<const double> values,
                                                 absl::Span<const double> mask,
                                                 const SumOverRanks& sum_over_ranks);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_ADVANTAGES_H_
