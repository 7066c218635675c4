#include "placement/drifting_trace.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tandem::placement {
namespace {

// SplitMix64 (Steele, Lea, Flood): a small generator whose output is fixed by its seed alone.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  int Below(int n) { return static_cast<int>(Uniform() * n); }

 private:
  uint64_t state_;
};

// Shuffles the experts at a random `count` of the ranking's positions among those positions.
void Drift(std::vector<int>& ranking, int count, SplitMix64& random) {
  std::vector<int> positions(ranking.size());
  std::iota(positions.begin(), positions.end(), 0);
  for (int i = 0; i < count; ++i) {  // The first `count` of a partial Fisher-Yates shuffle.
    std::swap(positions[i], positions[i + random.Below(static_cast<int>(positions.size()) - i)]);
  }
  std::vector<int> moved;
  for (int i = 0; i < count; ++i) moved.push_back(ranking[positions[i]]);
  for (int i = count - 1; i > 0; --i) std::swap(moved[i], moved[random.Below(i + 1)]);
  for (int i = 0; i < count; ++i) ranking[positions[i]] = moved[i];
}

}  // namespace

std::vector<StepLoad> DriftingTrace(const DriftingTraceConfig& config) {
  SplitMix64 random(config.seed);
  std::vector<double> cumulative(config.experts);  // Over popularity ranks.
  double total = 0;
  for (int rank = 0; rank < config.experts; ++rank) {
    total += 1.0 / std::pow(rank + 1, config.zipf);
    cumulative[rank] = total;
  }
  std::vector<int> ranking(config.experts);  // Popularity rank -> expert.
  std::iota(ranking.begin(), ranking.end(), 0);
  const int drifting = static_cast<int>(std::lround(config.drift * config.experts));
  std::vector<StepLoad> steps;
  std::vector<int> chosen;
  for (int s = 0; s < config.steps; ++s) {
    StepLoad& step = steps.emplace_back();
    step.micro_batches = config.micro_batches;
    step.experts = config.experts;
    step.tokens.assign(static_cast<size_t>(config.micro_batches) * config.experts, 0);
    for (int m = 0; m < config.micro_batches; ++m) {
      if (s > 0 || m > 0) Drift(ranking, drifting, random);
      for (int t = 0; t < config.tokens; ++t) {
        chosen.clear();
        while (static_cast<int>(chosen.size()) < config.top_k) {  // Without replacement.
          const int rank = static_cast<int>(
              std::upper_bound(cumulative.begin(), cumulative.end(), random.Uniform() * total) -
              cumulative.begin());
          const int expert = ranking[std::min(rank, config.experts - 1)];
          if (std::find(chosen.begin(), chosen.end(), expert) == chosen.end()) {
            chosen.push_back(expert);
          }
        }
        for (const int expert : chosen) {
          ++step.tokens[static_cast<size_t>(m) * config.experts + expert];
        }
      }
    }
  }
  return steps;
}

}  // namespace tandem::placement
