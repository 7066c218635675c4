#ifndef TANDEM_KERNELS_CUDA_ROUTER_H_
#define TANDEM_KERNELS_CUDA_ROUTER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/device.h"
#include "kernels/types.h"

namespace tandem::cuda {

// Call these as cuda::TopK(...) etc.: their cpu:: argument types make argument-dependent lookup
// find the CPU twins too.
// Device twins of kernels/cpu/router.h with the same contracts; all arrays in device memory.
// TopK orders experts exactly as the CPU does (key descending, ties to the lower id, NaN keys
// last, masked groups' keys 0), so identical scores give identical routes. INVALID_ARGUMENT
// unless 1 <= k <= min(64, E) and a group limit has equal groups of >= 2 experts, at most 64
// groups and 1 <= kept_groups <= groups.
absl::Status RouterScores(const float* logits, float* scores, int T, int E,
                          kernels::ScoringFunction scoring, Stream stream = nullptr);
absl::Status TopK(const float* scores, const float* selection_bias, int T, int E, int k,
                  int16_t* ids, const kernels::GroupLimit& limit = {}, Stream stream = nullptr);
absl::Status GateWeights(const float* scores, const int16_t* ids, int T, int E, int k,
                         bool normalize, float* gates, Stream stream = nullptr);
absl::Status RouterGatesBackward(const float* logits, const float* scores, const int16_t* ids,
                                 const float* dgates, float* dlogits, int T, int E, int k,
                                 bool normalize, kernels::ScoringFunction scoring,
                                 Stream stream = nullptr);

}  // namespace tandem::cuda

#endif  // TANDEM_KERNELS_CUDA_ROUTER_H_
