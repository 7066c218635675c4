#ifndef TANDEM_PLACEMENT_DRIFTING_TRACE_H_
#define TANDEM_PLACEMENT_DRIFTING_TRACE_H_

#include <cstdint>
#include <vector>

#include "placement/balance_planner.h"

namespace tandem::placement {

// The fixed synthetic routing trace the expert-balance bench measures planners on, whose hot
// experts drift: expert popularity is Zipf over popularity ranks (weight of rank i is
// 1 / (i + 1)^zipf), each token goes to top_k distinct experts drawn by popularity without
// replacement, and between consecutive micro-batches the ranking is rotated by a random
// permutation of `drift` of the experts (a random subset of ranks whose experts are shuffled
// among them). Written once and never tuned to a planner; its own generator (SplitMix64) so the
// trace is the same on every standard library.
struct DriftingTraceConfig {
  int experts = 256;
  int top_k = 8;
  int micro_batches = 16;  // Per step.
  int tokens = 4096;       // Per micro-batch.
  double zipf = 1.2;
  double drift = 0.1;
  int steps = 4;
  uint64_t seed = 20260526;
};

std::vector<StepLoad> DriftingTrace(const DriftingTraceConfig& config);

}  // namespace tandem::placement

#endif  // TANDEM_PLACEMENT_DRIFTING_TRACE_H_
