#ifndef TANDEM_COMMON_TESTING_FUZZ_CHECK_H_
#define TANDEM_COMMON_TESTING_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>

#include "absl/strings/string_view.h"

namespace tandem::testing {

// Asserts a property of the code under fuzz (a round trip, an invariant of a parsed value). A
// failure aborts: libFuzzer reports it as a crash and keeps the input that caused it.
inline void FuzzCheck(bool holds, absl::string_view property) {
  if (holds) return;
  std::fprintf(stderr, "fuzz property violated: %.*s\n", static_cast<int>(property.size()),
               property.data());
  std::abort();
}

}  // namespace tandem::testing

#endif  // TANDEM_COMMON_TESTING_FUZZ_CHECK_H_
