#ifndef TANDEM_KERNELS_CUDA_ATTENTION_H_
#define TANDEM_KERNELS_CUDA_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/device.h"
#include "kernels/types.h"

namespace tandem::cuda {

// Device twins of kernels/cpu/attention.h with the same layouts and shapes (any
// kernels::AttentionShape: grouped-query, latent attention's wider keys): q [T, H, qk_dim],
// k [T, KV, qk_dim], v [T, KV, v_dim], out [T, H, v_dim], probs [H, T, T] (row t: softmax over
// keys 0..t, zeros after). Call them as cuda::CausalAttention(...): the kernels::AttentionShape
// argument makes lookup find the CPU twins too.
//
// A plain row-per-block kernel that materializes the probabilities, as the CPU path and its
// backward need them; a fused (flash) kernel for long sequences is later work.
absl::Status CausalAttention(const float* q, const float* k, const float* v, float* out,
                             float* probs, int T, const kernels::AttentionShape& shape,
                             Stream stream = nullptr);

// Floats of device workspace CausalAttentionBackward needs: the score gradients, [H, T, T].
int64_t AttentionBackwardWorkspaceFloats(int T, const kernels::AttentionShape& shape);

// Accumulates into dq, dk, dv (any may be null) given dout and the saved probs. Every output row
// is owned by one block, so the result is deterministic (no atomics).
absl::Status CausalAttentionBackward(const float* q, const float* k, const float* v,
                                     const float* probs, const float* dout, float* dq, float* dk,
                                     float* dv, int T, const kernels::AttentionShape& shape,
                                     float* workspace, Stream stream = nullptr);

// Decode: one new query q [H, qk_dim] over cached k_cache [len, KV, qk_dim] and
// v_cache [len, KV, v_dim] (len >= 1, the new token's key and value already appended);
// out [H, v_dim]; scratch holds H * len floats of device memory.
absl::Status DecodeAttention(const float* q, const float* k_cache, const float* v_cache, int len,
                             float* out, const kernels::AttentionShape& shape, float* scratch,
                             Stream stream = nullptr);

// DecodeAttention for a batch of sequences in one launch: row r's query (q [rows, H, qk_dim])
// attends over its own cache, k_caches[r] / v_caches[r] holding lens[r] >= 1 positions in
// DecodeAttention's layout; out [rows, H, v_dim]. The pointer and length arrays are device
// memory; every lens[r] <= max_len; scratch holds rows * H * max_len floats.
absl::Status BatchedDecodeAttention(const float* q, const float* const* k_caches,
                                    const float* const* v_caches, const int* lens, int rows,
                                    int max_len, float* out, const kernels::AttentionShape& shape,
                                    float* scratch, Stream stream = nullptr);

// Appends each row's key and value to its sequence's cache, in one launch: row r of
// k [rows, key_width] goes to k_caches[r] + positions[r] * key_width, likewise for v.
// Pointer and position arrays are device memory.
absl::Status AppendToCaches(const float* k, const float* v, float* const* k_caches,
                            float* const* v_caches, const int* positions, int rows, int key_width,
                            int value_width, Stream stream = nullptr);

}  // namespace tandem::cuda

#endif  // TANDEM_KERNELS_CUDA_ATTENTION_H_
