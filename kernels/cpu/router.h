#ifndef TANDEM_KERNELS_CPU_ROUTER_H_
#define TANDEM_KERNELS_CPU_ROUTER_H_

#include <cstdint>
#include <string>

// MoE router kernels: scores, top-k selection, gate weights and their backward, and validation of
// replayed routes (R3). Arrays are row-major float32 with one row per token; expert ids are int16
// (the routing-record wire format), so up to 32767 experts and k <= 64.

namespace tandem::cpu {

enum class ScoringFunction { kSoftmax, kSigmoid };

// scores[T,E] = softmax(logits) row-wise, or sigmoid(logits) elementwise.
void RouterScores(const float* logits, float* scores, int T, int E, ScoringFunction scoring);

// DeepSeek-V3's group-limited routing (transformers' DeepseekV3TopkRouter): the E experts form
// `groups` equal groups of at least two; a group scores the sum of its two best selection keys;
// only the `kept_groups` best groups keep their keys, the others' keys become 0 (a masked_fill
// with 0.0, not -inf: a kept expert whose key is below 0 loses to a masked one, as there).
// groups = 1 limits nothing.
struct GroupLimit {
  int groups = 1;
  int kept_groups = 1;
};

// ids[T,k] = the k experts with the largest scores[t] + selection_bias (bias may be nullptr;
// DeepSeek-V3 uses a bias for selection only), after the group limit, in descending order of that
// key; ties broken by the lower expert id (deterministic), also between groups. The sum is taken
// in float, as the model computes it.
void TopK(const float* scores, const float* selection_bias, int T, int E, int k, int16_t* ids,
          const GroupLimit& limit = {});

// gates[T,k]: the selected scores, normalized to sum to 1 per row when normalize is true
// (gates = s_i / sum_{j in S} s_j). With softmax scoring this equals R3's
// g_i = exp(l_i) / sum_{j in S} exp(l_j). ids must be valid (0..E-1, no duplicates in a row).
void GateWeights(const float* scores, const int16_t* ids, int T, int E, int k, bool normalize,
                 float* gates);

// dlogits[T,E] += d(gates)/d(logits)^T . dgates, through the normalization and the scoring
// function (softmax: the full softmax Jacobian when normalize=false; sigmoid: s(1-s)). Only logits
// get gradients (ids are discrete).
void RouterGatesBackward(const float* logits, const float* scores, const int16_t* ids,
                         const float* dgates, float* dlogits, int T, int E, int k, bool normalize,
                         ScoringFunction scoring);

// Validates replayed routes for use in place of TopK: each row either all -1 ("use live routing
// for this token and layer") or k distinct ids in [0, E). Returns "" if fine, else a message
// naming the token, the slot and the value, e.g. "token 3 slot 1: expert 300 out of range
// [0, 256)", "token 5: expert 7 appears twice", "token 2: mixes -1 and expert ids".
std::string ValidateRoutes(const int16_t* ids, int T, int k, int E);

}  // namespace tandem::cpu

#endif  // TANDEM_KERNELS_CPU_ROUTER_H_
