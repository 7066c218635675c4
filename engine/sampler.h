#ifndef TANDEM_ENGINE_SAMPLER_H_
#define TANDEM_ENGINE_SAMPLER_H_

#include <cstdint>
#include <random>

#include "absl/status/status.h"

namespace tandem::engine {

struct SamplingConfig {
  float temperature = 1.0f;  // 0 = greedy (argmax; the lowest id wins a tie).
  float top_p = 1.0f;        // Keep the smallest most-likely prefix with this much mass; 1 = off.
  int top_k = 0;             // Keep the k most likely tokens; 0 = off.
};

// INVALID_ARGUMENT naming the field and value: temperature in [0, 100], top_p in (0, 1],
// top_k >= 0.
absl::Status Validate(const SamplingConfig& config);

struct SampledToken {
  int token;
  // log softmax(logits / temperature)[token], before top-k/top-p truncation (temperature 1 for
  // greedy decoding): RL uses it as log pi_old(token), and the trainer recomputes the same
  // quantity from its logits divided by the sampling temperature (veRL's semantics).
  float logprob;
};

// Draws a token from `logits[0..vocab)`: softmax(logits / temperature), then top-k, then top-p
// over the renormalized top-k mass (the order vLLM and HF use). Requires vocab >= 1, a config
// that passes Validate, and at least one finite logit (-inf masks a token out).
// Consumes exactly one rng() draw in every mode, greedy included, so a sample's stream position
// depends only on how many tokens it has drawn; the result is a pure function of the rng state
// and identical across standard libraries (no std distributions are used).
SampledToken SampleToken(const float* logits, int vocab, const SamplingConfig& config,
                         std::mt19937_64& rng);

// Seed for an independent stream (e.g. sample `stream` of a request with seed `seed`): callers
// keep one std::mt19937_64 per sample seeded with MixSeed(request_seed, sample_index), so a
// sample's tokens do not depend on batching or on the order samples are decoded in.
// Both inputs pass through splitmix64, so nearby seeds and streams give unrelated outputs.
uint64_t MixSeed(uint64_t seed, uint64_t stream);

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_SAMPLER_H_
