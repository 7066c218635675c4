#ifndef TANDEM_ENGINE_TRANSFORMER_ACTIVATIONS_H_
#define TANDEM_ENGINE_TRANSFORMER_ACTIVATIONS_H_

#include <cstdint>
#include <vector>

#include "engine/buffer.h"
#include "engine/expert_exchange.h"
#include "engine/model_ops.h"
#include "engine/transformer.h"

// Internal to the Transformer's implementation files.
namespace tandem::engine {

// Everything one layer's forward computed, kept for its backward.
struct Transformer::LayerActivations {
  Buffer<float> input, norm1, rstd1, q, k, v, attention, norm2_input, norm2, rstd2;
  Buffer<float> q_raw, k_raw, q_rstd, k_rstd;    // Projections before the q/k norms.
  Buffer<float> lora_q, lora_k, lora_v, lora_o;  // LoRA intermediates x·Aᵀ.
  // FFN rows: one per token (dense) or per routed (token, slot) in expert order (MoE). ffn_out
  // ends as the layer's output.
  Buffer<float> gate, up, activation, ffn_out;
  Buffer<float> lora_gate, lora_up, lora_down;
  std::vector<int> group_offsets;
  // MoE only.
  Buffer<float> router_logits, scores, gate_weights;
  Buffer<int16_t> ids;
  Buffer<int16_t> slots;  // ids as the exchange's expert slots, when it has its own order.
  ExpertPermutation permutation;
  // The rows the local experts computed (after Dispatch), and their results (after Combine: this
  // rank's routed rows in expert order).
  ExchangePlan exchange_plan;
  Buffer<float> expert_input, expert_output;
  Buffer<float> shared_gate, shared_up, shared_activation;
  // Latent attention only (transformer_latent.cc): the query down-projection before and after its
  // norm, the compressed keys and values (with the shared rotary key), their normalized latent
  // part, and its up-projection to per-head keys and values.
  Buffer<float> latent_q_a, latent_q_a_norm, latent_q_a_rstd;
  Buffer<float> latent_ckv, latent_c, latent_c_norm, latent_c_rstd, latent_kv;
};

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_TRANSFORMER_ACTIVATIONS_H_
