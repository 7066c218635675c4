#ifndef TANDEM_ENGINE_CUDA_CUDA_TRANSFORMER_STATE_H_
#define TANDEM_ENGINE_CUDA_CUDA_TRANSFORMER_STATE_H_

// Internal to CudaTransformer's implementation files (forward and backward).

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "engine/cuda/cuda_transformer.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/permute.h"

// Every step of a pass is a kernel launch, allocation or copy that may fail; the first failure
// ends the call.
#define TANDEM_RETURN_IF_ERROR(expr)                    \
  do {                                                  \
    if (absl::Status _status = (expr); !_status.ok()) { \
      return _status;                                   \
    }                                                   \
  } while (false)

// Declares `lhs` from the value of the StatusOr `expr`, or returns its error.
#define TANDEM_ASSIGN_OR_RETURN(lhs, expr)      \
  auto lhs##_or = (expr);                       \
  if (!lhs##_or.ok()) return lhs##_or.status(); \
  auto lhs = *std::move(lhs##_or)

namespace tandem::engine::cuda {

namespace gpu = ::tandem::cuda;
using gpu::DeviceArray;

// One layer's forward results, as the CPU Transformer's LayerActivations keeps them.
struct CudaTransformer::Activations {
  DeviceArray<float> input, norm1, rstd1, q_raw, q_rstd, k_raw, k_rstd, q, k, v, probs;
  DeviceArray<float> attention, mid, norm2, rstd2, ffn_in, gate, up, activation, ffn_rows_out;
  DeviceArray<float> lora_q, lora_k, lora_v, lora_o, lora_gate, lora_up, lora_down;
  DeviceArray<float> router_logits, scores, gate_weights, shared_gate, shared_up;
  DeviceArray<float> shared_activation;
  DeviceArray<int16_t> ids;
  std::optional<gpu::DevicePermutation> permutation;
};

// Per layer [positions, key_width] keys and [positions, value_width] values on the GPU.
struct CudaTransformer::DeviceSequenceCache : SequenceCache {
  std::vector<DeviceArray<float>> keys, values;
};

// The last pass: its inputs, routing bookkeeping and every layer's activations.
struct CudaTransformer::Pass {
  PassMode mode = PassMode::kPackedSequences;
  std::vector<DeviceSequenceCache*> caches;  // One per prompt (prefill) or per row (decode).
  std::vector<int> host_positions;
  // Decode: [layers, rows] pointers to each row's cache, its positions after this token, and
  // [rows, heads, max_seq_len] attention scores.
  DeviceArray<float*> cache_keys, cache_values;
  DeviceArray<int> cache_lengths;
  DeviceArray<float> decode_scores;
  int rows = 0;
  std::vector<int> sequence_starts;
  const std::vector<int16_t>* replay = nullptr;
  std::vector<uint8_t> token_replayed, token_differs;
  DeviceArray<int> tokens, positions, dense_offsets;
  std::vector<Activations> layers;
  DeviceArray<float> final_input, final_rstd, final_norm, logits;
  // Rows the head computes logits of: all, or each prompt's last (prefill: `last_rows`, whose
  // normalized states are gathered into `last_rows_norm`).
  int logit_rows = 0;
  DeviceArray<int> last_rows;
  DeviceArray<float> last_rows_norm;
};

// A zeroed device array; never empty, so its data() is a valid address even for size 0.
// Buffers freed while kernels that use them may still be queued (the backward's temporaries)
// are safe: DeviceMemory frees in stream order on the default stream, after the queued work
// (every kernel here runs on it).
template <typename T>
absl::Status Allocate(DeviceArray<T>& array, int64_t size) {
  absl::StatusOr<DeviceArray<T>> allocated = DeviceArray<T>::Zeros(std::max<int64_t>(size, 1));
  if (!allocated.ok()) return allocated.status();
  array = *std::move(allocated);
  return absl::OkStatus();
}

// y (+)= x · W_gᵀ per row group, W_g = w + g * w_stride ([out, in]): every projection's forward.
inline absl::Status MultiplyGroups(const float* x, const float* w, int64_t w_stride,
                                   const int* offsets, int groups, int rows, int in, int out,
                                   float* y, bool accumulate = false) {
  return gpu::GroupedGemm({.a = x,
                           .lda = in,
                           .w = w,
                           .w_group_stride = w_stride,
                           .ldw = in,
                           .transpose_w = true,
                           .c = y,
                           .ldc = out,
                           .n = out,
                           .k = in,
                           .beta = accumulate ? 1.0f : 0.0f},
                          offsets, groups, rows);
}

// dx += dy · W_g per row group: the input gradient of MultiplyGroups.
inline absl::Status MultiplyGroupsBackward(const float* dy, const float* w, int64_t w_stride,
                                           const int* offsets, int groups, int rows, int in,
                                           int out, float* dx) {
  return gpu::GroupedGemm({.a = dy,
                           .lda = out,
                           .w = w,
                           .w_group_stride = w_stride,
                           .ldw = in,
                           .transpose_w = false,
                           .c = dx,
                           .ldc = in,
                           .n = in,
                           .k = out,
                           .beta = 1.0f},
                          offsets, groups, rows);
}

}  // namespace tandem::engine::cuda

#endif  // TANDEM_ENGINE_CUDA_CUDA_TRANSFORMER_STATE_H_
