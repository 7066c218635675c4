#ifndef TANDEM_SERVICES_TRAINER_POLICY_LOSS_H_
#define TANDEM_SERVICES_TRAINER_POLICY_LOSS_H_

#include <vector>

#include "absl/types/span.h"

// The PPO-clip policy loss with dual clip, mismatch weights, an optional KL penalty to a
// reference policy, and veRL's aggregation modes (docs/trainer.md, "A step"), with its gradient with
// respect to each token's log-probability so the engine can backpropagate it.
namespace tandem::trainer {

enum class Aggregation { kTokenMean, kSeqMeanTokenSum, kSeqMeanTokenMean };
enum class KlEstimator { kK1, kK2, kK3 };

struct PolicyLossConfig {
  double clip_low = 0.2;
  double clip_high = 0.2;
  double dual_clip_c = 3.0;  // 0 disables.
  Aggregation aggregation = Aggregation::kTokenMean;
  double kl_coef = 0;  // > 0 needs reference log-probs.
  KlEstimator kl_estimator = KlEstimator::kK3;
};

// Per-token inputs, B x T row-major; weights and ref_logp may be empty (1 and no KL).
struct PolicyLossInputs {
  absl::Span<const double> logp;      // Current policy.
  absl::Span<const double> old_logp;  // Policy that the ratio is taken against.
  absl::Span<const double> advantages;
  absl::Span<const double> mask;
  absl::Span<const double> weights;
  absl::Span<const double> ref_logp;
  int rows = 0;
  int cols = 0;
  // The mini-batch these rows are a micro-batch of, for the aggregation's denominators; 0: these
  // rows are the whole batch.
  double total_tokens = 0;
  int total_rows = 0;
};

struct PolicyLossResult {
  double loss = 0;
  std::vector<double> dlogp;  // d loss / d logp, B x T.
  double clip_share = 0;      // Masked tokens where the ratio clip (or dual clip) was active.
  double ref_kl = 0;          // Masked mean of the KL estimate; 0 without reference.
};

PolicyLossResult ComputePolicyLoss(const PolicyLossInputs& inputs, const PolicyLossConfig& config);

// KL estimate for d = logp - ref_logp and its derivative with respect to logp.
double KlEstimate(double d, KlEstimator estimator);
double KlEstimateGradient(double d, KlEstimator estimator);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_POLICY_LOSS_H_
