#ifndef TANDEM_ENGINE_HF_QWEN3_MOE_H_
#define TANDEM_ENGINE_HF_QWEN3_MOE_H_

#include <vector>

#include "absl/status/statusor.h"
#include "engine/hf/hf_checkpoint.h"
#include "nlohmann/json.hpp"

namespace tandem::engine::hf {

// The fields of a Qwen3MoeForCausalLM config.json that shape its computation (transformers'
// Qwen3MoeConfig; defaults as there).
struct Qwen3MoeConfig {
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;      // Dense MLP layers.
  int moe_intermediate_size = 0;  // Each expert.
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;  // Grouped-query attention: heads share K/V in groups.
  int head_dim = 0;             // Not necessarily hidden_size / num_attention_heads.
  int num_experts = 0;
  int num_experts_per_tok = 0;
  int decoder_sparse_step = 1;       // Layer l is MoE when (l + 1) % step == 0 ...
  std::vector<int> mlp_only_layers;  // ... and l is not listed here.
  bool norm_topk_prob = false;       // Renormalize the top-k gates to sum to 1.
  bool tie_word_embeddings = false;  // lm_head reuses embed_tokens.
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  int max_position_embeddings = 0;

  bool IsMoeLayer(int layer) const;
};

// INVALID_ARGUMENT naming the field for an architecture other than Qwen3MoeForCausalLM, a
// missing or out-of-range size, and any setting this engine does not compute exactly as
// transformers does (hidden_act other than silu, rope_scaling, sliding windows, attention
// bias) — never a silent approximation.
absl::StatusOr<Qwen3MoeConfig> Qwen3MoeConfigFromJson(const nlohmann::json& config);

// Every tensor of the architecture with its HF name and shape.
TensorShapes Qwen3MoeTensorShapes(const Qwen3MoeConfig& config);

}  // namespace tandem::engine::hf

#endif  // TANDEM_ENGINE_HF_QWEN3_MOE_H_
