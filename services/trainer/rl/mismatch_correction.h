#ifndef TANDEM_SERVICES_TRAINER_MISMATCH_CORRECTION_H_
#define TANDEM_SERVICES_TRAINER_MISMATCH_CORRECTION_H_

#include <vector>

#include "absl/types/span.h"

// Training-inference mismatch corrections (docs/trainer.md, "A step"): importance weights from
// log rho_t = logp_old(trainer) - logp_rollout, per token of a B x T masked batch.
namespace tandem::trainer {

enum class IsMode { kNone, kTokenTis, kSequenceTis, kIcePop, kRejection };
enum class RejectionLevel { kToken, kSequence };

// IcePop's default beta: it masks tokens outside [alpha, beta] instead of clipping their weight,
// so its band is wider than TIS's cap.
inline constexpr double kIcePopUpper = 5.0;

struct IsConfig {
  IsMode mode = IsMode::kNone;
  double upper = 2.0;  // C for TIS, beta for IcePop, the upper ratio for rejection.
  double lower = 0.5;  // alpha for IcePop, the lower ratio for rejection.
  RejectionLevel level = RejectionLevel::kToken;
};

struct IsWeights {
  std::vector<double> weights;  // B x T, detached; 1 everywhere for kNone.
  std::vector<double> mask;     // B x T: the input mask, minus what rejection dropped.
  double ess = 1;               // 1 / mean((w / mean w)^2) over masked tokens, in (0, 1].
  double clipped_share = 0;     // Masked tokens whose weight was clipped, zeroed or rejected.
};

IsWeights ComputeIsWeights(absl::Span<const double> log_ratio, absl::Span<const double> mask,
                           int rows, int cols, const IsConfig& config);

// 1 / mean((w / mean w)^2) over tokens with mask > 0; 1 when there are none or all weights are 0.
double EffectiveSampleSize(absl::Span<const double> weights, absl::Span<const double> mask);
// The same from the sums over those tokens (a batch spread over ranks sums its shares'): their
// count, sum of w and sum of w^2.
double EffectiveSampleSize(double count, double sum, double sum_squares);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_MISMATCH_CORRECTION_H_
