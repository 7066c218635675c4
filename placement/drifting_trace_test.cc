#include "placement/drifting_trace.h"

#include <algorithm>
#include <numeric>

#include "gtest/gtest.h"

namespace tandem::placement {
namespace {

int HottestExpert(const StepLoad& step, int micro_batch) {
  const auto first = step.tokens.begin() + static_cast<size_t>(micro_batch) * step.experts;
  return static_cast<int>(std::max_element(first, first + step.experts) - first);
}

TEST(DriftingTraceTest, EveryTokenGoesToTopKExpertsAndTheHotOnesDrift) {
  const DriftingTraceConfig config{
      .experts = 64, .top_k = 4, .micro_batches = 8, .tokens = 512, .drift = 0.5, .steps = 3};
  const std::vector<StepLoad> trace = DriftingTrace(config);
  ASSERT_EQ(trace.size(), 3u);
  for (const StepLoad& step : trace) {
    ASSERT_EQ(step.tokens.size(), 8u * 64);
    for (int m = 0; m < 8; ++m) {
      const auto first = step.tokens.begin() + m * 64;
      EXPECT_EQ(std::accumulate(first, first + 64, int64_t{0}), 512 * 4);
      // Zipf 1.2: the most popular expert takes far more than a fair share.
      EXPECT_GT(*std::max_element(first, first + 64), 4 * 512 * 4 / 64);
    }
  }
  int hottest_changes = 0;
  for (int m = 1; m < 8; ++m)
    hottest_changes += HottestExpert(trace[0], m) != HottestExpert(trace[0], 0);
  EXPECT_GT(hottest_changes, 0) << "popularity drifts between micro-batches";
  EXPECT_EQ(DriftingTrace(config)[2].tokens, trace[2].tokens) << "fixed by its seed";
}

}  // namespace
}  // namespace tandem::placement
