#ifndef TANDEM_ENGINE_VERIFIERS_VERIFIER_H_
#define TANDEM_ENGINE_VERIFIERS_VERIFIER_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::engine {

// Scores a completion (already cut at its end of sequence) against a dataset's reference
// answer: 1 correct, 0 not.
using Verifier = double (*)(absl::string_view completion, absl::string_view reference);

// The verifier a job spec names:
//   "exact_match": the completion is the reference, byte for byte;
//   "math": the completion's final answer (\boxed{} or "####") equals the reference's by value
//           or normalised text (see MathReward).
// INVALID_ARGUMENT naming the known verifiers for any other name.
absl::StatusOr<Verifier> FindVerifier(absl::string_view name);

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_VERIFIERS_VERIFIER_H_
