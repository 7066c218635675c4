#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem::engine {
namespace {

constexpr uint64_t kGoldenGamma = 0x9e3779b97f4a7c15ULL;

// The splitmix64 output function (Steele, Lea, Flood 2014).
uint64_t SplitMix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Uniform in [0, 1) from the top 53 bits, exactly representable as a double.
double UnitUniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// The first maximum, so greedy, top_k = 1 and a tiny top_p agree on ties.
int Argmax(const float* logits, int vocab) {
  return static_cast<int>(std::max_element(logits, logits + vocab) - logits);
}

// log sum_i exp(logits[i] / temperature).
double LogSumExp(const float* logits, int vocab, float max_logit, double temperature) {
  double sum = 0.0;
  for (int i = 0; i < vocab; ++i) {
    sum += std::exp((static_cast<double>(logits[i]) - max_logit) / temperature);
  }
  return max_logit / temperature + std::log(sum);
}

// Token ids most likely first (ties by lower id), cut to top_k; all ids in id order if no cut.
std::vector<int> Candidates(const float* logits, int vocab, int top_k, bool sort_all) {
  std::vector<int> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  const int keep = top_k > 0 ? std::min(top_k, vocab) : vocab;
  if (keep == vocab && !sort_all) return ids;
  std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), [logits](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  ids.resize(static_cast<size_t>(keep));
  return ids;
}

// Drops the tail of the (sorted) candidates beyond the first prefix holding top_p of their mass.
void ApplyTopP(float top_p, std::vector<int>& ids, std::vector<double>& weights) {
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  double mass = 0.0;
  for (size_t i = 0; i < weights.size(); ++i) {
    mass += weights[i];
    if (mass >= top_p * total) {
      ids.resize(i + 1);
      weights.resize(i + 1);
      return;
    }
  }
}

// Inverse CDF at u in [0, 1). The fallback covers rounding making the sum fall short of u*total;
// it returns the last candidate with weight so a masked-out token is never drawn.
int Pick(const std::vector<int>& ids, const std::vector<double>& weights, double u) {
  const double target = u * std::accumulate(weights.begin(), weights.end(), 0.0);
  double mass = 0.0;
  int last_positive = ids.front();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (weights[i] <= 0.0) continue;
    mass += weights[i];
    if (target < mass) return ids[i];
    last_positive = ids[i];
  }
  return last_positive;
}

int Draw(const float* logits, int vocab, const SamplingConfig& config, float max_logit, double u) {
  const bool top_p_on = config.top_p < 1.0f;
  std::vector<int> ids = Candidates(logits, vocab, config.top_k, top_p_on);
  std::vector<double> weights(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    weights[i] = std::exp((static_cast<double>(logits[ids[i]]) - max_logit) / config.temperature);
  }
  if (top_p_on) ApplyTopP(config.top_p, ids, weights);
  return Pick(ids, weights, u);
}

}  // namespace

absl::Status Validate(const SamplingConfig& config) {
  // Written as negated ranges so NaN fails too.
  if (!(config.temperature >= 0.0f && config.temperature <= 100.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature = ", config.temperature, " is outside [0, 100]"));
  }
  if (!(config.top_p > 0.0f && config.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p = ", config.top_p, " is outside (0, 1]"));
  }
  if (config.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_k = ", config.top_k, " is negative (0 turns top-k off)"));
  }
  return absl::OkStatus();
}

SampledToken SampleToken(const float* logits, int vocab, const SamplingConfig& config,
                         std::mt19937_64& rng) {
  const double u = UnitUniform(rng);
  const int argmax = Argmax(logits, vocab);
  const float max_logit = logits[argmax];
  const bool greedy = config.temperature <= 0.0f || config.top_k == 1;
  const int token = greedy ? argmax : Draw(logits, vocab, config, max_logit, u);
  // Log-probability under softmax(logits / T); greedy decoding reports the T = 1 distribution.
  const double temperature = config.temperature > 0.0f ? config.temperature : 1.0;
  const double log_z = LogSumExp(logits, vocab, max_logit, temperature);
  return {token, static_cast<float>(static_cast<double>(logits[token]) / temperature - log_z)};
}

uint64_t MixSeed(uint64_t seed, uint64_t stream) {
  return SplitMix64(SplitMix64(seed) + kGoldenGamma * (stream + 1));
}

}  // namespace tandem::engine
