#include "engine/hf/qwen3_moe.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"

namespace tandem::engine::hf {
namespace {

constexpr char kArchitecture[] = "Qwen3MoeForCausalLM";

absl::Status Invalid(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("config.json ", field, ": ", why));
}

// A positive integer field; `fallback` (when >= 0) stands in for a missing one.
absl::StatusOr<int> Size(const nlohmann::json& config, const char* field, int fallback = -1) {
  if (!config.contains(field) || config[field].is_null()) {
    if (fallback >= 0) return fallback;
    return Invalid(field, "is required");
  }
  const nlohmann::json& value = config[field];
  if (!value.is_number_integer() || value.get<int64_t>() < 1 || value.get<int64_t>() > (1 << 24)) {
    return Invalid(field, absl::StrCat(value.dump(), " is not a size in [1, 2^24]"));
  }
  return value.get<int>();
}

// What transformers would compute differently from this engine.
absl::Status CheckSupported(const nlohmann::json& config) {
  const nlohmann::json architectures = config.value("architectures", nlohmann::json::array());
  if (architectures != nlohmann::json::array({kArchitecture})) {
    return Invalid("architectures",
                   absl::StrCat(architectures.dump(), " is not [\"", kArchitecture, "\"]"));
  }
  if (config.value("hidden_act", "silu") != "silu") {
    return Invalid("hidden_act", absl::StrCat(config["hidden_act"].dump(), " is not supported"));
  }
  if (config.contains("rope_scaling") && !config["rope_scaling"].is_null()) {
    return Invalid("rope_scaling", absl::StrCat(config["rope_scaling"].dump(),
                                                " is not supported (plain RoPE only)"));
  }
  for (const char* flag : {"use_sliding_window", "attention_bias"}) {
    if (config.value(flag, false)) return Invalid(flag, "true is not supported");
  }
  return absl::OkStatus();
}

absl::Status ReadSizes(const nlohmann::json& json, Qwen3MoeConfig& config) {
  struct Field {
    const char* name;
    int* target;
    int fallback;
  };
  const Field fields[] = {
      {"vocab_size", &config.vocab_size, -1},
      {"hidden_size", &config.hidden_size, -1},
      {"intermediate_size", &config.intermediate_size, -1},
      {"moe_intermediate_size", &config.moe_intermediate_size, -1},
      {"num_hidden_layers", &config.num_hidden_layers, -1},
      {"num_attention_heads", &config.num_attention_heads, -1},
      {"num_experts", &config.num_experts, -1},
      {"num_experts_per_tok", &config.num_experts_per_tok, -1},
      {"max_position_embeddings", &config.max_position_embeddings, -1},
      {"decoder_sparse_step", &config.decoder_sparse_step, 1},
  };
  for (const Field& field : fields) {
    auto value = Size(json, field.name, field.fallback);
    if (!value.ok()) return value.status();
    *field.target = *value;
  }
  // transformers' defaults: K/V heads = heads, head_dim = hidden / heads.
  auto kv_heads = Size(json, "num_key_value_heads", config.num_attention_heads);
  auto head_dim = Size(json, "head_dim", config.hidden_size / config.num_attention_heads);
  if (!kv_heads.ok()) return kv_heads.status();
  if (!head_dim.ok()) return head_dim.status();
  config.num_key_value_heads = *kv_heads;
  config.head_dim = *head_dim;
  if (config.num_attention_heads % config.num_key_value_heads != 0) {
    return Invalid("num_key_value_heads", "must divide num_attention_heads");
  }
  if (config.num_experts_per_tok > config.num_experts) {
    return Invalid("num_experts_per_tok", "exceeds num_experts");
  }
  if (config.head_dim % 2 != 0) return Invalid("head_dim", "must be even for RoPE");
  return absl::OkStatus();
}

absl::Status ReadRest(const nlohmann::json& json, Qwen3MoeConfig& config) {
  const nlohmann::json layers = json.value("mlp_only_layers", nlohmann::json::array());
  for (const nlohmann::json& layer : layers.is_null() ? nlohmann::json::array() : layers) {
    if (!layer.is_number_integer() || layer.get<int>() < 0 ||
        layer.get<int>() >= config.num_hidden_layers) {
      return Invalid("mlp_only_layers", absl::StrCat(layer.dump(), " is not a layer index"));
    }
    config.mlp_only_layers.push_back(layer.get<int>());
  }
  config.norm_topk_prob = json.value("norm_topk_prob", false);
  config.tie_word_embeddings = json.value("tie_word_embeddings", false);
  config.rms_norm_eps = json.value("rms_norm_eps", 1e-6);
  config.rope_theta = json.value("rope_theta", 10000.0);
  if (!(config.rms_norm_eps > 0)) return Invalid("rms_norm_eps", "must be > 0");
  if (!(config.rope_theta > 0)) return Invalid("rope_theta", "must be > 0");
  return absl::OkStatus();
}

}  // namespace

bool Qwen3MoeConfig::IsMoeLayer(int layer) const {
  return std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) ==
             mlp_only_layers.end() &&
         num_experts > 0 && (layer + 1) % decoder_sparse_step == 0;
}

absl::StatusOr<Qwen3MoeConfig> Qwen3MoeConfigFromJson(const nlohmann::json& json) {
  try {
    if (absl::Status status = CheckSupported(json); !status.ok()) return status;
    Qwen3MoeConfig config;
    if (absl::Status status = ReadSizes(json, config); !status.ok()) return status;
    if (absl::Status status = ReadRest(json, config); !status.ok()) return status;
    return config;
  } catch (const nlohmann::json::exception& error) {  // A field of the wrong JSON type.
    return Invalid("", error.what());
  }
}

TensorShapes Qwen3MoeTensorShapes(const Qwen3MoeConfig& config) {
  const int64_t hidden = config.hidden_size;
  const int64_t q_dim = int64_t{config.num_attention_heads} * config.head_dim;
  const int64_t kv_dim = int64_t{config.num_key_value_heads} * config.head_dim;
  TensorShapes shapes = {{"model.embed_tokens.weight", {config.vocab_size, hidden}},
                         {"model.norm.weight", {hidden}}};
  if (!config.tie_word_embeddings) shapes["lm_head.weight"] = {config.vocab_size, hidden};
  for (int layer = 0; layer < config.num_hidden_layers; ++layer) {
    const std::string prefix = absl::StrCat("model.layers.", layer, ".");
    shapes[prefix + "input_layernorm.weight"] = {hidden};
    shapes[prefix + "post_attention_layernorm.weight"] = {hidden};
    shapes[prefix + "self_attn.q_proj.weight"] = {q_dim, hidden};
    shapes[prefix + "self_attn.k_proj.weight"] = {kv_dim, hidden};
    shapes[prefix + "self_attn.v_proj.weight"] = {kv_dim, hidden};
    shapes[prefix + "self_attn.o_proj.weight"] = {hidden, q_dim};
    shapes[prefix + "self_attn.q_norm.weight"] = {config.head_dim};
    shapes[prefix + "self_attn.k_norm.weight"] = {config.head_dim};
    auto mlp = [&](const std::string& at, int64_t ffn) {
      shapes[at + "gate_proj.weight"] = {ffn, hidden};
      shapes[at + "up_proj.weight"] = {ffn, hidden};
      shapes[at + "down_proj.weight"] = {hidden, ffn};
    };
    if (!config.IsMoeLayer(layer)) {
      mlp(prefix + "mlp.", config.intermediate_size);
      continue;
    }
    shapes[prefix + "mlp.gate.weight"] = {config.num_experts, hidden};
    for (int expert = 0; expert < config.num_experts; ++expert) {
      mlp(absl::StrCat(prefix, "mlp.experts.", expert, "."), config.moe_intermediate_size);
    }
  }
  return shapes;
}

}  // namespace tandem::engine::hf
