#ifndef TANDEM_KERNELS_CPU_ROUTER_H_
#define TANDEM_KERNELS_CPU_ROUTER_H_

#include <cstdint>

#include "kernels/types.h"

// MoE router kernels: scores, top-k selection, gate weights and their backward, and validation of
// replayed routes (R3). Arrays are row-major float32 with one row per token; expert ids are int16
// (the routing-record wire format), so up to 32767 experts and k <= 64.

namespace tandem::cpu {

// scores[T,E] = softmax(logits) row-wise, or sigmoid(logits) elementwise.
void RouterScores(const float* logits, float* scores, int T, int E,
                  kernels::ScoringFunction scoring);

// ids[T,k] = the k experts with the largest scores[t] + selection_bias (bias may be nullptr;
// DeepSeek-V3 uses a bias for selection only), after the group limit, in descending order of that
// key; ties broken by the lower expert id (deterministic), also between groups. The sum is taken
// in float, as the model computes it.
void TopK(const float* scores, const float* selection_bias, int T, int E, int k, int16_t* ids,
          const kernels::GroupLimit& limit = {});

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
                         kernels::ScoringFunction scoring);

}  // namespace tandem::cpu

#endif  // TANDEM_KERNELS_CPU_ROUTER_H_
