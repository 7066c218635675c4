#include "engine/verifiers/verifier.h"

#include "absl/strings/str_cat.h"
#include "engine/verifiers/math_answer.h"

namespace tandem::engine {
namespace {

double ExactMatch(absl::string_view completion, absl::string_view reference) {
  return completion == reference ? 1.0 : 0.0;
}

}  // namespace

absl::StatusOr<Verifier> FindVerifier(absl::string_view name) {
  if (name == "exact_match") return &ExactMatch;
  if (name == "math") return &MathReward;
  return absl::InvalidArgumentError(
      absl::StrCat("'", name, "' is unknown; known: exact_match, math"));
}

}  // namespace tandem::engine
