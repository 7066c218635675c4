#include "engine/hf/hf_architecture.h"

#include <set>
#include <string>

#include "absl/strings/str_cat.h"

namespace tandem::engine::hf {
namespace {

using nlohmann::json;

absl::Status Invalid(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("config.json ", field, ": ", why));
}

bool IsSet(const json& config, const char* field) {
  return config.contains(field) && !config[field].is_null();
}

// A positive integer field; `fallback` (when >= 0) stands in for a missing one.
absl::StatusOr<int> Size(const json& config, const char* field, int fallback = -1) {
  if (!IsSet(config, field)) {
    if (fallback >= 0) return fallback;
    return Invalid(field, "is required");
  }
  const json& value = config[field];
  if (!value.is_number_integer() || value.get<int64_t>() < 1 || value.get<int64_t>() > (1 << 24)) {
    return Invalid(field, absl::StrCat(value.dump(), " is not a size in [1, 2^24]"));
  }
  return value.get<int>();
}

absl::StatusOr<double> Positive(const json& config, const char* field, double fallback) {
  if (!IsSet(config, field)) return fallback;
  if (!config[field].is_number() || !(config[field].get<double>() > 0)) {
    return Invalid(field, absl::StrCat(config[field].dump(), " is not a positive number"));
  }
  return config[field].get<double>();
}

// Settings transformers would compute differently from the engine: each must be absent, null,
// false or zero.
absl::Status RefuseSet(const json& config, std::initializer_list<const char*> fields) {
  for (const char* field : fields) {
    if (!IsSet(config, field)) continue;
    const json& value = config[field];
    if (value == false || (value.is_number() && value.get<double>() == 0)) continue;
    return Invalid(field, absl::StrCat(value.dump(), " is not supported by the engine"));
  }
  return absl::OkStatus();
}

// What every supported architecture reads alike: attention, vocabulary, norms, RoPE, routing.
// `default_kv_heads` is the architecture config's num_key_value_heads default (0: the heads).
absl::Status ReadShared(const json& json_config, const char* experts_field, int default_kv_heads,
                        ModelConfig& config) {
  if (json_config.value("hidden_act", "silu") != "silu") {
    return Invalid("hidden_act",
                   absl::StrCat(json_config["hidden_act"].dump(), " is not supported (silu only)"));
  }
  if (absl::Status status = RefuseSet(json_config, {"attention_bias"}); !status.ok()) {
    return status;
  }
  struct Field {
    const char* name;
    int* target;
  };
  for (const Field& field :
       {Field{"vocab_size", &config.vocab_size}, Field{"hidden_size", &config.d_model},
        Field{"num_hidden_layers", &config.num_layers},
        Field{"num_attention_heads", &config.num_heads}, Field{experts_field, &config.num_experts},
        Field{"num_experts_per_tok", &config.top_k},
        Field{"max_position_embeddings", &config.max_seq_len}}) {
    auto value = Size(json_config, field.name);
    if (!value.ok()) return value.status();
    *field.target = *value;
  }
  // transformers' defaults: head_dim = hidden / heads; K/V heads as the architecture says.
  auto kv_heads = Size(json_config, "num_key_value_heads",
                       default_kv_heads > 0 ? default_kv_heads : config.num_heads);
  auto head_dim = Size(json_config, "head_dim", config.d_model / config.num_heads);
  if (!kv_heads.ok()) return kv_heads.status();
  if (!head_dim.ok()) return head_dim.status();
  if (config.num_heads % *kv_heads != 0) {
    return Invalid("num_key_value_heads", "must divide num_attention_heads");
  }
  if (config.top_k > config.num_experts) {
    return Invalid("num_experts_per_tok", absl::StrCat("exceeds ", experts_field));
  }
  if (*head_dim % 2 != 0) return Invalid("head_dim", "must be even for RoPE");
  config.num_kv_heads = *kv_heads;
  config.attention_head_dim = *head_dim;
  config.num_dense_layers = 0;
  config.scoring = kernels::ScoringFunction::kSoftmax;
  config.tie_word_embeddings = json_config.value("tie_word_embeddings", false);
  return absl::OkStatus();
}

// rope_scaling: null, or YaRN as transformers' _compute_yarn_parameters reads it. Other types,
// unknown keys, and a factor that disagrees with max_position_embeddings /
// original_max_position_embeddings (which transformers versions resolve differently) are refused.
absl::Status ReadRopeScaling(const json& json_config, ModelConfig& config) {
  if (!IsSet(json_config, "rope_scaling")) return absl::OkStatus();
  const json& scaling = json_config["rope_scaling"];
  const std::string type = scaling.value("rope_type", scaling.value("type", ""));
  if (type != "yarn") {
    return Invalid("rope_scaling.rope_type",
                   absl::StrCat("\"", type, "\" is not supported (yarn only)"));
  }
  for (const auto& [key, value] : scaling.items()) {
    static const std::set<std::string> kKnown = {
        "rope_type",      "type",      "factor",           "original_max_position_embeddings",
        "beta_fast",      "beta_slow", "attention_factor", "mscale",
        "mscale_all_dim", "truncate"};
    if (!kKnown.contains(key))
      return Invalid(absl::StrCat("rope_scaling.", key), "is not supported");
  }
  cpu::YarnParams& yarn = config.rope_yarn;
  auto factor = Positive(scaling, "factor", 0);
  if (!factor.ok() || *factor < 1) return Invalid("rope_scaling.factor", "must be a number >= 1");
  yarn.factor = *factor;
  auto original = Size(scaling, "original_max_position_embeddings", config.max_seq_len);
  if (!original.ok()) return Invalid("rope_scaling", original.status().message());
  yarn.original_max_position = *original;
  if (scaling.contains("original_max_position_embeddings") &&
      static_cast<double>(config.max_seq_len) / yarn.original_max_position != yarn.factor) {
    return Invalid("rope_scaling.factor",
                   absl::StrCat(yarn.factor,
                                " is not max_position_embeddings / "
                                "original_max_position_embeddings = ",
                                config.max_seq_len, " / ", yarn.original_max_position));
  }
  struct Field {
    const char* name;
    double* target;
  };
  for (const Field& field :
       {Field{"beta_fast", &yarn.beta_fast}, Field{"beta_slow", &yarn.beta_slow},
        Field{"attention_factor", &yarn.attention_factor}, Field{"mscale", &yarn.mscale},
        Field{"mscale_all_dim", &yarn.mscale_all_dim}}) {
    auto value = Positive(scaling, field.name, *field.target);
    if (!value.ok()) return Invalid(absl::StrCat("rope_scaling.", field.name), "must be > 0");
    *field.target = *value;
  }
  yarn.truncate = scaling.value("truncate", true);
  return absl::OkStatus();
}

absl::Status ReadNormAndRope(const json& json_config, double default_eps, double default_theta,
                             ModelConfig& config) {
  auto eps = Positive(json_config, "rms_norm_eps", default_eps);
  auto theta = Positive(json_config, "rope_theta", default_theta);
  if (!eps.ok()) return eps.status();
  if (!theta.ok()) return theta.status();
  config.norm_eps = static_cast<float>(*eps);
  config.rope_theta = static_cast<float>(*theta);
  return ReadRopeScaling(json_config, config);
}

// modeling_qwen3_moe.py: per-head q/k RMSNorm; MoE layers placed by decoder_sparse_step and
// mlp_only_layers; softmax routing, top-k renormalized when norm_topk_prob.
absl::StatusOr<HfArchitecture> Qwen3Moe(const json& json_config) {
  HfArchitecture architecture{.name = "Qwen3MoeForCausalLM"};
  ModelConfig& config = architecture.config;
  for (absl::Status status : {ReadShared(json_config, "num_experts", 4, config),
                              ReadNormAndRope(json_config, 1e-6, 10000.0, config),
                              RefuseSet(json_config, {"use_sliding_window"})}) {
    if (!status.ok()) return status;
  }
  auto dense_ffn = Size(json_config, "intermediate_size");
  auto expert_ffn = Size(json_config, "moe_intermediate_size");
  auto sparse_step = Size(json_config, "decoder_sparse_step", 1);
  for (const auto* value : {&dense_ffn, &expert_ffn, &sparse_step}) {
    if (!value->ok()) return value->status();
  }
  config.dense_ffn_dim = *dense_ffn;
  config.expert_ffn_dim = *expert_ffn;
  config.decoder_sparse_step = *sparse_step;
  const json layers = json_config.value("mlp_only_layers", json::array());
  for (const json& layer : layers.is_null() ? json::array() : layers) {
    if (!layer.is_number_integer() || layer.get<int>() < 0 ||
        layer.get<int>() >= config.num_layers) {
      return Invalid("mlp_only_layers", absl::StrCat(layer.dump(), " is not a layer index"));
    }
    config.mlp_only_layers.push_back(layer.get<int>());
  }
  config.qk_norm = QkNorm::kPerHead;
  config.norm_topk_prob = json_config.value("norm_topk_prob", false);
  return architecture;
}

// modeling_mixtral.py: every layer MoE ("block_sparse_moe", experts w1/w3/w2); softmax
// routing with the top-k always renormalized; no q/k norms.
absl::StatusOr<HfArchitecture> Mixtral(const json& json_config) {
  HfArchitecture architecture{.name = "MixtralForCausalLM", .names = MixtralModuleNames()};
  ModelConfig& config = architecture.config;
  for (absl::Status status : {ReadShared(json_config, "num_local_experts", 8, config),
                              ReadNormAndRope(json_config, 1e-5, 1e6, config),
                              RefuseSet(json_config, {"sliding_window", "router_jitter_noise"})}) {
    if (!status.ok()) return status;
  }
  auto ffn = Size(json_config, "intermediate_size");
  if (!ffn.ok()) return ffn.status();
  config.dense_ffn_dim = config.expert_ffn_dim = *ffn;
  config.norm_topk_prob = true;
  return architecture;
}

// modeling_olmoe.py: every layer MoE; q/k RMSNorm over the whole projection (before it is
// split into heads); softmax routing, top-k renormalized only when norm_topk_prob.
absl::StatusOr<HfArchitecture> Olmoe(const json& json_config) {
  HfArchitecture architecture{.name = "OlmoeForCausalLM"};
  ModelConfig& config = architecture.config;
  for (absl::Status status :
       {ReadShared(json_config, "num_experts", 0, config),
        ReadNormAndRope(json_config, 1e-5, 10000.0, config),
        RefuseSet(json_config, {"clip_qkv", "head_dim"})}) {  // head_dim: OLMoE has none.
    if (!status.ok()) return status;
  }
  auto ffn = Size(json_config, "intermediate_size");
  if (!ffn.ok()) return ffn.status();
  config.dense_ffn_dim = config.expert_ffn_dim = *ffn;
  config.qk_norm = QkNorm::kWholeProjection;
  config.norm_topk_prob = json_config.value("norm_topk_prob", false);
  return architecture;
}

// A config field with transformers' default when absent (or null, where null is no value).
template <typename T>
absl::StatusOr<T> Field(const json& config, const char* name, T fallback) {
  if (!IsSet(config, name)) return fallback;
  try {
    return config[name].get<T>();
  } catch (const json::exception&) {
    return Invalid(name, absl::StrCat(config[name].dump(), " has the wrong type"));
  }
}

// modeling_deepseek_v3.py: multi-head latent attention; the first first_k_dense_replace layers
// dense, the rest DeepSeek's MoE block (sigmoid scores, selection-only e_score_correction_bias,
// n_group/topk_group group-limited routing, norm_topk_prob, routed_scaling_factor,
// n_shared_experts). Defaults as DeepseekV3Config's.
absl::StatusOr<HfArchitecture> DeepseekV3(const json& json_config) {
  HfArchitecture architecture{.name = "DeepseekV3ForCausalLM", .ignores_extra_layers = true};
  ModelConfig& config = architecture.config;
  for (absl::Status status : {ReadShared(json_config, "n_routed_experts", 0, config),
                              ReadNormAndRope(json_config, 1e-6, 10000.0, config)}) {
    if (!status.ok()) return status;
  }
  if (json_config.value("topk_method", "noaux_tc") != "noaux_tc") {
    return Invalid("topk_method", "only noaux_tc (DeepSeek-V3's) is supported");
  }
  if (json_config.value("scoring_func", "sigmoid") != "sigmoid") {
    return Invalid("scoring_func", "only sigmoid (DeepSeek-V3's) is supported");
  }
  if (json_config.value("moe_layer_freq", 1) != 1) return Invalid("moe_layer_freq", "must be 1");
  struct SizeField {
    const char* name;
    int* target;
    int fallback;
  };
  for (const SizeField& field : {
           SizeField{"intermediate_size", &config.dense_ffn_dim, -1},
           SizeField{"moe_intermediate_size", &config.expert_ffn_dim, -1},
           SizeField{"kv_lora_rank", &config.kv_lora_rank, -1},
           SizeField{"qk_nope_head_dim", &config.qk_nope_head_dim, -1},
           SizeField{"qk_rope_head_dim", &config.qk_rope_head_dim, -1},
           SizeField{"v_head_dim", &config.v_head_dim, -1},
           SizeField{"n_group", &config.num_expert_groups, 8},
           SizeField{"topk_group", &config.kept_expert_groups, 4},
       }) {
    auto value = Size(json_config, field.name, field.fallback);
    if (!value.ok()) return value.status();
    *field.target = *value;
  }
  auto shared_experts = Field(json_config, "n_shared_experts", 1);
  if (!shared_experts.ok()) return shared_experts.status();
  if (*shared_experts < 0 || *shared_experts > 64) {
    return Invalid("n_shared_experts", absl::StrCat(*shared_experts, " is not in 0..64"));
  }
  config.num_shared_experts = *shared_experts;
  // Absent: DeepseekV3Config's 1536; null: queries straight from q_proj.
  auto q_lora_rank = Size(json_config, "q_lora_rank", 0);
  if (!q_lora_rank.ok()) return q_lora_rank.status();
  config.q_lora_rank = json_config.contains("q_lora_rank") ? *q_lora_rank : 1536;
  auto first_dense = Field(json_config, "first_k_dense_replace", 3);
  auto scaling = Field(json_config, "routed_scaling_factor", 2.5);
  auto normalize = Field(json_config, "norm_topk_prob", true);
  auto interleave = Field(json_config, "rope_interleave", true);
  if (!first_dense.ok()) return first_dense.status();
  if (!scaling.ok()) return scaling.status();
  if (!normalize.ok()) return normalize.status();
  if (!interleave.ok()) return interleave.status();
  config.num_dense_layers = *first_dense;
  config.routed_scaling_factor = static_cast<float>(*scaling);
  config.norm_topk_prob = *normalize;
  config.rope_interleave = *interleave;
  config.scoring = kernels::ScoringFunction::kSigmoid;
  return architecture;
}

absl::StatusOr<HfArchitecture> Read(const json& json_config) {
  const json architectures = json_config.value("architectures", json::array());
  const std::string name = architectures.size() == 1 && architectures[0].is_string()
                               ? architectures[0].get<std::string>()
                               : "";
  if (name == "Qwen3MoeForCausalLM") return Qwen3Moe(json_config);
  if (name == "MixtralForCausalLM") return Mixtral(json_config);
  if (name == "OlmoeForCausalLM") return Olmoe(json_config);
  if (name == "DeepseekV3ForCausalLM") return DeepseekV3(json_config);
  return Invalid("architectures",
                 absl::StrCat(architectures.dump(),
                              " is not one of Qwen3MoeForCausalLM, MixtralForCausalLM, "
                              "OlmoeForCausalLM, DeepseekV3ForCausalLM"));
}

void AddLatentAttentionShapes(const ModelConfig& config, const std::string& prefix,
                              TensorShapes& shapes) {
  const int64_t hidden = config.d_model, heads = config.num_heads;
  const int64_t qk = config.qk_nope_head_dim + config.qk_rope_head_dim;
  if (config.q_lora_rank > 0) {
    shapes[prefix + "q_a_proj.weight"] = {config.q_lora_rank, hidden};
    shapes[prefix + "q_a_layernorm.weight"] = {config.q_lora_rank};
    shapes[prefix + "q_b_proj.weight"] = {heads * qk, config.q_lora_rank};
  } else {
    shapes[prefix + "q_proj.weight"] = {heads * qk, hidden};
  }
  shapes[prefix + "kv_a_proj_with_mqa.weight"] = {config.kv_lora_rank + config.qk_rope_head_dim,
                                                  hidden};
  shapes[prefix + "kv_a_layernorm.weight"] = {config.kv_lora_rank};
  shapes[prefix + "kv_b_proj.weight"] = {heads * (config.qk_nope_head_dim + config.v_head_dim),
                                         config.kv_lora_rank};
}

}  // namespace

absl::StatusOr<HfArchitecture> HfArchitectureFromConfig(const json& json_config) {
  absl::StatusOr<HfArchitecture> architecture;
  try {
    architecture = Read(json_config);
  } catch (const json::exception& error) {  // A field of the wrong JSON type.
    return Invalid("", error.what());
  }
  if (!architecture.ok()) return architecture.status();
  if (absl::Status status = architecture->config.Validate(); !status.ok()) {
    return Invalid("", absl::StrCat("as engine config: ", status.message()));
  }
  return architecture;
}

TensorShapes HfTensorShapes(const HfArchitecture& architecture) {
  const ModelConfig& config = architecture.config;
  const int64_t hidden = config.d_model;
  const int64_t q_dim = config.q_dim();
  const int64_t kv_dim = config.kv_dim();
  TensorShapes shapes = {{"model.embed_tokens.weight", {config.vocab_size, hidden}},
                         {"model.norm.weight", {hidden}}};
  if (!config.tie_word_embeddings) shapes["lm_head.weight"] = {config.vocab_size, hidden};
  for (int layer = 0; layer < config.num_layers; ++layer) {
    const std::string prefix = absl::StrCat("model.layers.", layer, ".");
    shapes[prefix + "input_layernorm.weight"] = {hidden};
    shapes[prefix + "post_attention_layernorm.weight"] = {hidden};
    if (config.latent_attention()) {
      AddLatentAttentionShapes(config, prefix + "self_attn.", shapes);
    } else {
      shapes[prefix + "self_attn.q_proj.weight"] = {q_dim, hidden};
      shapes[prefix + "self_attn.k_proj.weight"] = {kv_dim, hidden};
      shapes[prefix + "self_attn.v_proj.weight"] = {kv_dim, hidden};
    }
    shapes[prefix + "self_attn.o_proj.weight"] = {hidden, config.attention_out_dim()};
    if (config.qk_norm != QkNorm::kNone) {
      const bool per_head = config.qk_norm == QkNorm::kPerHead;
      shapes[prefix + "self_attn.q_norm.weight"] = {per_head ? config.head_dim() : q_dim};
      shapes[prefix + "self_attn.k_norm.weight"] = {per_head ? config.head_dim() : kv_dim};
    }
    auto mlp = [&](const std::string& at, const std::array<std::string, 3>& names, int64_t ffn) {
      shapes[at + names[0] + ".weight"] = {ffn, hidden};
      shapes[at + names[1] + ".weight"] = {ffn, hidden};
      shapes[at + names[2] + ".weight"] = {hidden, ffn};
    };
    if (!config.IsMoeLayer(layer)) {
      mlp(prefix + "mlp.", MoeModuleNames{}.projections, config.dense_ffn_dim);
      continue;
    }
    const std::string block = absl::StrCat(prefix, architecture.names.block, ".");
    shapes[block + "gate.weight"] = {config.num_experts, hidden};
    if (config.scoring == kernels::ScoringFunction::kSigmoid) {
      shapes[block + "gate.e_score_correction_bias"] = {config.num_experts};
    }
    if (config.num_shared_experts > 0) {
      mlp(block + "shared_experts.", MoeModuleNames{}.projections, config.shared_expert_ffn_dim());
    }
    for (int expert = 0; expert < config.num_experts; ++expert) {
      mlp(absl::StrCat(block, "experts.", expert, "."), architecture.names.projections,
          config.expert_ffn_dim);
    }
  }
  return shapes;
}

}  // namespace tandem::engine::hf
