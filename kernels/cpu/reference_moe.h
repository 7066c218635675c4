#ifndef TANDEM_KERNELS_CPU_REFERENCE_MOE_H_
#define TANDEM_KERNELS_CPU_REFERENCE_MOE_H_

#include <cstdint>
#include <string>

#include "kernels/cpu/grouped_lora.h"
#include "kernels/cpu/permute.h"
#include "kernels/cpu/router.h"

// Plain, obviously-correct twins of the MoE kernels (router, permute, grouped LoRA) for tests:
// naive loops, double accumulation, no BLAS. Same contracts as the fast versions.

namespace tandem::cpu::reference {

void RouterScores(const float* logits, float* scores, int T, int E,
                  kernels::ScoringFunction scoring);
// Group limits by sorting every group's keys in full (not a max and a runner-up).
void TopK(const float* scores, const float* selection_bias, int T, int E, int k, int16_t* ids,
          const kernels::GroupLimit& limit = {});
void GateWeights(const float* scores, const int16_t* ids, int T, int E, int k, bool normalize,
                 float* gates);
// Builds the full Jacobian d(gates)/d(logits) in double from the logits alone (scores is unused),
// so it shares no shortcut with the fast kernel.
void RouterGatesBackward(const float* logits, const float* scores, const int16_t* ids,
                         const float* dgates, float* dlogits, int T, int E, int k, bool normalize,
                         kernels::ScoringFunction scoring);
std::string ValidateRoutes(const int16_t* ids, int T, int k, int E);

ExpertPermutation BuildPermutation(const int16_t* ids, int T, int k, int E);
void PermuteRows(const float* x, const ExpertPermutation& permutation, float* out, int d);
void PermuteRowsBackward(const float* dout, const ExpertPermutation& permutation, float* dx, int d);
void UnpermuteAdd(const float* y, const ExpertPermutation& permutation, const float* gates,
                  float* out, int d);
void UnpermuteAddBackward(const float* y, const ExpertPermutation& permutation, const float* gates,
                          const float* dout, float* dy, float* dgates, int d);

void GroupedLoraForward(const float* x, const int* offsets, int groups, int in, int out,
                        const kernels::GroupedLoraWeights& lora, float* h, float* y);
void GroupedLoraBackward(const float* x, const int* offsets, int groups, int in, int out,
                         const kernels::GroupedLoraWeights& lora, const float* h, const float* dy,
                         float* dx, float* da, float* db);

}  // namespace tandem::cpu::reference

#endif  // TANDEM_KERNELS_CPU_REFERENCE_MOE_H_
