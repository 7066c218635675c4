#ifndef TANDEM_ENGINE_CONFIG_H_
#define TANDEM_ENGINE_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cpu/rope.h"
#include "kernels/types.h"

namespace tandem::engine {

// Where attention normalizes queries and keys (RMSNorm) before RoPE: not at all, per head
// over head_dim (Qwen3), or over the whole projection before it is split into heads (OLMoE).
enum class QkNorm { kNone, kPerHead, kWholeProjection };

// Shape of the decoder-only MoE transformer: token embedding; layers of RMSNorm -> causal
// grouped-query attention with RoPE -> RMSNorm -> FFN, dense SwiGLU or MoE; final RMSNorm;
// LM head. The defaults are the embedded model's; Hugging Face architectures set the rest
// (engine/hf).
struct ModelConfig {
  int vocab_size = 0;
  int d_model = 64;
  int num_heads = 4;
  int num_kv_heads = 0;        // Heads of keys and values, dividing num_heads; 0: num_heads.
  int attention_head_dim = 0;  // 0: d_model / num_heads.
  QkNorm qk_norm = QkNorm::kNone;
  // DeepSeek's multi-head latent attention when kv_lora_rank > 0: queries from q_proj, or from
  // q_a_proj -> RMSNorm -> q_b_proj when q_lora_rank > 0; keys and values expanded by kv_b_proj
  // from a normalized kv_lora_rank-wide vector of kv_a_proj_with_mqa, which also gives the
  // qk_rope_head_dim key dimensions every head shares. Queries and keys are qk_nope_head_dim +
  // qk_rope_head_dim wide, values v_head_dim; RoPE turns the last qk_rope_head_dim, in
  // interleaved pairs when rope_interleave. num_kv_heads and attention_head_dim are unused.
  int kv_lora_rank = 0;
  int q_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  bool rope_interleave = true;
  int num_layers = 4;
  // Layer l is MoE unless l < num_dense_layers (DeepSeek's first_k_dense_replace), or
  // (l + 1) % decoder_sparse_step != 0, or l is in mlp_only_layers (Qwen's placement).
  int num_dense_layers = 1;
  int decoder_sparse_step = 1;
  std::vector<int> mlp_only_layers;
  int dense_ffn_dim = 128;
  int num_experts = 8;
  int top_k = 2;
  int expert_ffn_dim = 64;
  // Always-on experts beside the routed ones, run as one MLP of num_shared_experts *
  // expert_ffn_dim (DeepSeek's n_shared_experts).
  int num_shared_experts = 0;
  kernels::ScoringFunction scoring = kernels::ScoringFunction::kSoftmax;
  // DeepSeek-V3's group-limited routing (n_group, topk_group; 1 and 1 limit nothing) and the
  // factor the gate weights are multiplied by (routed_scaling_factor).
  int num_expert_groups = 1;
  int kept_expert_groups = 1;
  float routed_scaling_factor = 1.0f;
  // Gate weights are the selected scores renormalized to sum to 1 (else the scores as they
  // are, e.g. softmax probabilities over all experts).
  bool norm_topk_prob = true;
  bool tie_word_embeddings = false;  // The LM head is the token embedding.
  int max_seq_len = 48;
  float rope_theta = 10000.0f;
  cpu::YarnParams rope_yarn;  // original_max_position 0: plain RoPE.
  float norm_eps = 1e-5f;

  int head_dim() const { return attention_head_dim > 0 ? attention_head_dim : d_model / num_heads; }
  int kv_heads() const { return num_kv_heads > 0 ? num_kv_heads : num_heads; }
  int shared_expert_ffn_dim() const { return num_shared_experts * expert_ffn_dim; }
  int q_dim() const { return num_heads * head_dim(); }    // q_proj out (standard attention).
  int kv_dim() const { return kv_heads() * head_dim(); }  // k_proj and v_proj out.
  bool latent_attention() const { return kv_lora_rank > 0; }
  // Heads, widths and scale of the attention kernels, either kind.
  kernels::AttentionShape attention_shape() const;
  // Rows of queries, cached keys and cached values, and o_proj's input, either kind.
  int query_width() const { return num_heads * attention_shape().qk_dim; }
  int key_width() const { return attention_shape().kv_heads * attention_shape().qk_dim; }
  int value_width() const { return attention_shape().kv_heads * attention_shape().v_dim; }
  int attention_out_dim() const { return num_heads * attention_shape().v_dim; }
  int rope_dim() const { return latent_attention() ? qk_rope_head_dim : head_dim(); }
  bool IsMoeLayer(int layer) const;
  // The rotation frequencies of attention: plain RoPE of rope_theta, or YaRN.
  cpu::RopeFrequencies RopeFrequencies() const;
  int num_moe_layers() const { return static_cast<int>(MoeLayerIndices().size()); }
  // Global indices of the MoE layers: routing records name layers by these, never by
  // "i-th MoE layer", so dense layers can never shift rows.
  std::vector<int> MoeLayerIndices() const;
  // Layer `layer`'s place among the MoE layers (the routes' layer index); -1 for a dense layer.
  int MoeIndex(int layer) const;

  // INVALID_ARGUMENT naming the first field out of range.
  absl::Status Validate() const;
  std::string ToJson() const;
  static absl::StatusOr<ModelConfig> FromJson(const std::string& json);
};

// Where LoRA experts keep their adapters (docs/engine.md, LoRA on MoE).
enum class ExpertLayout { kPerExpert, kShared, kSharedOuter };

absl::string_view ExpertLayoutName(ExpertLayout layout);
absl::StatusOr<ExpertLayout> ExpertLayoutFromName(absl::string_view name);

// A LoRA adapter's configuration; it travels with the adapter (safetensors metadata).
struct LoraConfig {
  int rank = 8;
  float alpha = 16.0f;
  // Subset of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj. The router,
  // embeddings, norms and LM head are never adapted; gate/up/down apply to the dense MLPs
  // and to every routed expert (not to the shared expert).
  std::vector<std::string> targets = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                      "gate_proj", "up_proj", "down_proj"};
  ExpertLayout expert_layout = ExpertLayout::kPerExpert;

  // Applied once, inside the LoRA kernel; tensors are stored unscaled.
  float scale() const { return alpha / static_cast<float>(rank); }
  bool Targets(absl::string_view module) const;
  absl::Status Validate() const;
  std::string ToJson() const;
  static absl::StatusOr<LoraConfig> FromJson(const std::string& json);
};

// The default model of `./tandem demo`: small enough that a few hundred RL steps take
// minutes on two cores, large enough to route non-trivially (8 experts, top-2).
ModelConfig DefaultModelConfig();

// The default config resized for benchmarks: d_model (FFN widths and heads scale with it),
// layers, routed experts and top-k; 0 keeps the default's value.
ModelConfig ScaledDefaultModelConfig(int d_model, int num_layers, int num_experts, int top_k);

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_CONFIG_H_
