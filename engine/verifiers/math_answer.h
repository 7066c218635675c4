#ifndef TANDEM_ENGINE_VERIFIERS_MATH_ANSWER_H_
#define TANDEM_ENGINE_VERIFIERS_MATH_ANSWER_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace tandem::engine {

// The final answer a solution states, as math RL verifiers read it: the content of its last
// \boxed{...} (or \fbox{...}; nested braces allowed), else what follows its last "####" on
// that line (GSM8K). nullopt when it states neither.
std::optional<std::string> FinalAnswer(absl::string_view solution);

// 1 when the completion's final answer equals the reference, else 0. The reference may be a
// bare answer ("72", "\frac{1}{2}") or a whole solution ending in "#### 72" or \boxed{}.
// Numbers compare by value, exactly: thousands separators, a leading '+', U+2212 minus, '$',
// '%', trailing zeros, \frac{a}{b}, \dfrac, \tfrac and a/b are normalised, so "1,000" equals
// "1000.00" and "\frac{2}{4}" equals "0.5". Anything else compares as text, without spaces,
// \left/\right, \text{} wrappers, or a trailing period.
double MathReward(absl::string_view completion, absl::string_view reference);

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_VERIFIERS_MATH_ANSWER_H_
