#ifndef TANDEM_ENGINE_HF_HF_ARCHITECTURE_H_
#define TANDEM_ENGINE_HF_HF_ARCHITECTURE_H_

#include <string>

#include "absl/status/statusor.h"
#include "engine/config.h"
#include "engine/hf/hf_checkpoint.h"
#include "engine/module_names.h"
#include "nlohmann/json.hpp"

namespace tandem::engine::hf {

// A Hugging Face architecture as the engine computes it: the engine config that computes it
// exactly, and the names its checkpoints give the MoE tensors (the others are named as the
// engine names them: model.embed_tokens, model.layers.{l}.self_attn.{q,k,v,o}_proj and
// {q,k}_norm, input_layernorm, post_attention_layernorm, mlp.{gate,up,down}_proj of dense
// layers, model.norm, lm_head).
struct HfArchitecture {
  std::string name;  // config.json "architectures", e.g. "Qwen3MoeForCausalLM".
  ModelConfig config;
  // model.layers.{l}.<names.block>.gate.weight is the router and
  // model.layers.{l}.<names.block>.experts.{e}.<names.projections[i]>.weight expert e's
  // gate_proj, up_proj and down_proj.
  MoeModuleNames names;
  // Tensors of layers num_hidden_layers and beyond are not part of the model (DeepSeek-V3 keeps
  // its multi-token-prediction layer there, which transformers ignores too).
  bool ignores_extra_layers = false;
};

// The architecture of a config.json: Qwen3MoeForCausalLM, MixtralForCausalLM, OlmoeForCausalLM
// or DeepseekV3ForCausalLM, with transformers' defaults for absent fields. INVALID_ARGUMENT naming
// the field for any other architecture, a missing or out-of-range size, and every setting
// the engine would not compute exactly as transformers does (rope_scaling other than YaRN,
// sliding windows, attention biases, activations other than silu, clip_qkv, router jitter,
// DeepSeek's other routing methods) — never a silent approximation.
absl::StatusOr<HfArchitecture> HfArchitectureFromConfig(const nlohmann::json& config);

// Every tensor a checkpoint of the architecture holds, by HF name, with its shape.
TensorShapes HfTensorShapes(const HfArchitecture& architecture);

}  // namespace tandem::engine::hf

#endif  // TANDEM_ENGINE_HF_HF_ARCHITECTURE_H_
