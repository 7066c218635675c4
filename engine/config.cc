#include "engine/config.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/tokenizer.h"
#include "nlohmann/json.hpp"

namespace tandem::engine {
namespace {

using nlohmann::json;

constexpr const char* kLoraModules[] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                        "gate_proj", "up_proj", "down_proj"};

absl::Status CheckRange(absl::string_view field, double value, double low, double high) {
  if (value < low || value > high) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " = ", value, " is outside [", low, ", ", high, "]"));
  }
  return absl::OkStatus();
}

absl::string_view ScoringName(kernels::ScoringFunction scoring) {
  return scoring == kernels::ScoringFunction::kSoftmax ? "softmax" : "sigmoid";
}

constexpr std::pair<QkNorm, const char*> kQkNormNames[] = {
    {QkNorm::kNone, "none"},
    {QkNorm::kPerHead, "per_head"},
    {QkNorm::kWholeProjection, "whole_projection"}};

const char* QkNormName(QkNorm norm) {
  for (const auto& [value, name] : kQkNormNames) {
    if (value == norm) return name;
  }
  return "none";
}

absl::StatusOr<QkNorm> QkNormFromName(absl::string_view name) {
  for (const auto& [value, known] : kQkNormNames) {
    if (name == known) return value;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("qk_norm = '", name, "' is not none, per_head or whole_projection"));
}

template <typename T>
absl::Status Read(const json& object, const char* key, T& out) {
  if (!object.contains(key)) return absl::OkStatus();  // Absent keys keep the default.
  try {
    out = object.at(key).get<T>();
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config field '", key, "': ", e.what()));
  }
  return absl::OkStatus();
}

absl::StatusOr<json> ParseObject(const std::string& text) {
  json object = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!object.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config is not a JSON object: '", text.substr(0, 80), "'"));
  }
  return object;
}

}  // namespace

bool ModelConfig::IsMoeLayer(int layer) const {
  return layer >= num_dense_layers && (layer + 1) % decoder_sparse_step == 0 &&
         std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) == mlp_only_layers.end();
}

cpu::RopeFrequencies ModelConfig::RopeFrequencies() const {
  if (rope_yarn.original_max_position == 0) {
    return cpu::RopeFrequencies::Plain(rope_theta, rope_dim());
  }
  return cpu::RopeFrequencies::Yarn(rope_theta, rope_dim(), rope_yarn);
}

kernels::AttentionShape ModelConfig::attention_shape() const {
  if (!latent_attention())
    return kernels::AttentionShape::Standard(num_heads, kv_heads(), head_dim());
  const int qk_dim = qk_nope_head_dim + qk_rope_head_dim;
  // modeling_deepseek_v3.py: YaRN with mscale_all_dim scales the scores by its mscale squared.
  const double mscale = rope_yarn.factor > 1 && rope_yarn.mscale_all_dim > 0
                            ? cpu::YarnMscale(rope_yarn.factor, rope_yarn.mscale_all_dim)
                            : 1.0;
  return {.heads = num_heads,
          .kv_heads = num_heads,
          .qk_dim = qk_dim,
          .v_dim = v_head_dim,
          .scale = static_cast<float>(mscale * mscale / std::sqrt(static_cast<double>(qk_dim)))};
}

std::vector<int> ModelConfig::MoeLayerIndices() const {
  std::vector<int> indices;
  for (int layer = 0; layer < num_layers; ++layer) {
    if (IsMoeLayer(layer)) indices.push_back(layer);
  }
  return indices;
}

int ModelConfig::MoeIndex(int layer) const {
  const std::vector<int> indices = MoeLayerIndices();
  const auto at = std::find(indices.begin(), indices.end(), layer);
  return at == indices.end() ? -1 : static_cast<int>(at - indices.begin());
}

absl::Status ModelConfig::Validate() const {
  const std::pair<absl::string_view, std::tuple<double, double, double>> checks[] = {
      {"vocab_size", {vocab_size, 1, 1 << 20}},
      {"d_model", {d_model, 1, 1 << 16}},
      {"num_heads", {num_heads, 1, 1 << 12}},
      {"num_kv_heads", {num_kv_heads, 0, num_heads}},
      {"attention_head_dim", {attention_head_dim, 0, 1 << 12}},
      {"kv_lora_rank", {kv_lora_rank, 0, 1 << 16}},
      {"q_lora_rank", {q_lora_rank, 0, 1 << 16}},
      {"qk_nope_head_dim", {qk_nope_head_dim, latent_attention() ? 1 : 0, 1 << 12}},
      {"qk_rope_head_dim", {qk_rope_head_dim, latent_attention() ? 2 : 0, 1 << 12}},
      {"v_head_dim", {v_head_dim, latent_attention() ? 1 : 0, 1 << 12}},
      {"num_layers", {num_layers, 1, 1024}},
      {"num_dense_layers", {num_dense_layers, 0, num_layers}},
      {"decoder_sparse_step", {decoder_sparse_step, 1, num_layers}},
      {"dense_ffn_dim", {dense_ffn_dim, 1, 1 << 18}},
      {"num_experts", {num_experts, 1, 32767}},
      {"top_k", {top_k, 1, std::min(num_experts, 64)}},
      {"expert_ffn_dim", {expert_ffn_dim, 1, 1 << 18}},
      {"num_shared_experts", {num_shared_experts, 0, 64}},
      {"num_expert_groups", {num_expert_groups, 1, num_experts}},
      {"kept_expert_groups", {kept_expert_groups, 1, num_expert_groups}},
      {"routed_scaling_factor", {routed_scaling_factor, 1e-6, 1e6}},
      {"max_seq_len", {max_seq_len, 2, 1 << 20}},
      {"rope_theta", {rope_theta, 1, 1e9}},
      {"yarn_factor", {rope_yarn.factor, 1, 1e6}},
      {"yarn_original_max_position",
       {rope_yarn.original_max_position, rope_yarn.factor == 1.0 ? 0 : 1, 1 << 24}},
      // (original_max_position 0 is plain RoPE, so a YaRN factor needs it.)
      {"yarn_beta_fast", {rope_yarn.beta_fast, 1e-6, 1e6}},
      {"yarn_beta_slow", {rope_yarn.beta_slow, 1e-6, 1e6}},
      {"yarn_attention_factor", {rope_yarn.attention_factor, 0, 1e6}},
      {"yarn_mscale", {rope_yarn.mscale, 0, 1e6}},
      {"yarn_mscale_all_dim", {rope_yarn.mscale_all_dim, 0, 1e6}},
      {"norm_eps", {norm_eps, 1e-12, 1}},
  };
  for (const auto& [field, range] : checks) {
    const auto [value, low, high] = range;
    if (absl::Status status = CheckRange(field, value, low, high); !status.ok()) return status;
  }
  if (attention_head_dim == 0 && d_model % num_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("d_model = ", d_model, " must split into ",
                                                   num_heads, " heads without attention_head_dim"));
  }
  if (rope_dim() % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rotary dimension ", rope_dim(), " must be even for RoPE"));
  }
  if (latent_attention() && qk_norm != QkNorm::kNone) {
    return absl::InvalidArgumentError("qk_norm must be none with latent attention");
  }
  if (num_heads % kv_heads() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_kv_heads = ", num_kv_heads, " must divide num_heads = ", num_heads));
  }
  if (num_expert_groups > 1 &&
      (num_experts % num_expert_groups != 0 || num_experts / num_expert_groups < 2 ||
       kept_expert_groups * (num_experts / num_expert_groups) < top_k)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_expert_groups = ", num_expert_groups, " must split ", num_experts,
        " experts into groups of at least 2, of which kept_expert_groups = ", kept_expert_groups,
        " hold at least top_k = ", top_k));
  }
  for (int layer : mlp_only_layers) {
    if (absl::Status status = CheckRange("mlp_only_layers", layer, 0, num_layers - 1);
        !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

std::string ModelConfig::ToJson() const {
  return json{{"vocab_size", vocab_size},
              {"d_model", d_model},
              {"num_heads", num_heads},
              {"num_kv_heads", num_kv_heads},
              {"attention_head_dim", attention_head_dim},
              {"qk_norm", QkNormName(qk_norm)},
              {"kv_lora_rank", kv_lora_rank},
              {"q_lora_rank", q_lora_rank},
              {"qk_nope_head_dim", qk_nope_head_dim},
              {"qk_rope_head_dim", qk_rope_head_dim},
              {"v_head_dim", v_head_dim},
              {"rope_interleave", rope_interleave},
              {"num_layers", num_layers},
              {"num_dense_layers", num_dense_layers},
              {"decoder_sparse_step", decoder_sparse_step},
              {"mlp_only_layers", mlp_only_layers},
              {"dense_ffn_dim", dense_ffn_dim},
              {"num_experts", num_experts},
              {"top_k", top_k},
              {"expert_ffn_dim", expert_ffn_dim},
              {"num_shared_experts", num_shared_experts},
              {"num_expert_groups", num_expert_groups},
              {"kept_expert_groups", kept_expert_groups},
              {"routed_scaling_factor", routed_scaling_factor},
              {"scoring", std::string(ScoringName(scoring))},
              {"norm_topk_prob", norm_topk_prob},
              {"tie_word_embeddings", tie_word_embeddings},
              {"max_seq_len", max_seq_len},
              {"rope_theta", rope_theta},
              {"yarn_factor", rope_yarn.factor},
              {"yarn_original_max_position", rope_yarn.original_max_position},
              {"yarn_beta_fast", rope_yarn.beta_fast},
              {"yarn_beta_slow", rope_yarn.beta_slow},
              {"yarn_attention_factor", rope_yarn.attention_factor},
              {"yarn_mscale", rope_yarn.mscale},
              {"yarn_mscale_all_dim", rope_yarn.mscale_all_dim},
              {"yarn_truncate", rope_yarn.truncate},
              {"norm_eps", norm_eps}}
      .dump();
}

absl::StatusOr<ModelConfig> ModelConfig::FromJson(const std::string& text) {
  auto object = ParseObject(text);
  if (!object.ok()) return object.status();
  ModelConfig config;
  std::string scoring = "softmax";
  std::string qk_norm = "none";
  for (absl::Status status :
       {Read(*object, "vocab_size", config.vocab_size),
        Read(*object, "d_model", config.d_model),
        Read(*object, "num_heads", config.num_heads),
        Read(*object, "num_kv_heads", config.num_kv_heads),
        Read(*object, "attention_head_dim", config.attention_head_dim),
        Read(*object, "qk_norm", qk_norm),
        Read(*object, "kv_lora_rank", config.kv_lora_rank),
        Read(*object, "q_lora_rank", config.q_lora_rank),
        Read(*object, "qk_nope_head_dim", config.qk_nope_head_dim),
        Read(*object, "qk_rope_head_dim", config.qk_rope_head_dim),
        Read(*object, "v_head_dim", config.v_head_dim),
        Read(*object, "rope_interleave", config.rope_interleave),
        Read(*object, "num_layers", config.num_layers),
        Read(*object, "num_dense_layers", config.num_dense_layers),
        Read(*object, "decoder_sparse_step", config.decoder_sparse_step),
        Read(*object, "mlp_only_layers", config.mlp_only_layers),
        Read(*object, "norm_topk_prob", config.norm_topk_prob),
        Read(*object, "tie_word_embeddings", config.tie_word_embeddings),
        Read(*object, "dense_ffn_dim", config.dense_ffn_dim),
        Read(*object, "num_experts", config.num_experts),
        Read(*object, "top_k", config.top_k),
        Read(*object, "expert_ffn_dim", config.expert_ffn_dim),
        Read(*object, "num_shared_experts", config.num_shared_experts),
        Read(*object, "num_expert_groups", config.num_expert_groups),
        Read(*object, "kept_expert_groups", config.kept_expert_groups),
        Read(*object, "routed_scaling_factor", config.routed_scaling_factor),
        Read(*object, "scoring", scoring),
        Read(*object, "max_seq_len", config.max_seq_len),
        Read(*object, "rope_theta", config.rope_theta),
        Read(*object, "yarn_factor", config.rope_yarn.factor),
        Read(*object, "yarn_original_max_position", config.rope_yarn.original_max_position),
        Read(*object, "yarn_beta_fast", config.rope_yarn.beta_fast),
        Read(*object, "yarn_beta_slow", config.rope_yarn.beta_slow),
        Read(*object, "yarn_attention_factor", config.rope_yarn.attention_factor),
        Read(*object, "yarn_mscale", config.rope_yarn.mscale),
        Read(*object, "yarn_mscale_all_dim", config.rope_yarn.mscale_all_dim),
        Read(*object, "yarn_truncate", config.rope_yarn.truncate),
        Read(*object, "norm_eps", config.norm_eps)}) {
    if (!status.ok()) return status;
  }
  if (scoring != "softmax" && scoring != "sigmoid") {
    return absl::InvalidArgumentError(
        absl::StrCat("scoring = '", scoring, "' is not softmax or sigmoid"));
  }
  config.scoring = scoring == "softmax" ? kernels::ScoringFunction::kSoftmax
                                        : kernels::ScoringFunction::kSigmoid;
  auto parsed_qk_norm = QkNormFromName(qk_norm);
  if (!parsed_qk_norm.ok()) return parsed_qk_norm.status();
  config.qk_norm = *parsed_qk_norm;
  if (absl::Status status = config.Validate(); !status.ok()) return status;
  return config;
}

absl::string_view ExpertLayoutName(ExpertLayout layout) {
  switch (layout) {
    case ExpertLayout::kPerExpert:
      return "per_expert";
    case ExpertLayout::kShared:
      return "shared";
    case ExpertLayout::kSharedOuter:
      return "shared_outer";
  }
  return "unknown";
}

absl::StatusOr<ExpertLayout> ExpertLayoutFromName(absl::string_view name) {
  for (ExpertLayout layout :
       {ExpertLayout::kPerExpert, ExpertLayout::kShared, ExpertLayout::kSharedOuter}) {
    if (ExpertLayoutName(layout) == name) return layout;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("expert_layout = '", name, "' is not per_expert, shared or shared_outer"));
}

bool LoraConfig::Targets(absl::string_view module) const {
  return std::find(targets.begin(), targets.end(), module) != targets.end();
}

absl::Status LoraConfig::Validate() const {
  if (absl::Status status = CheckRange("lora rank", rank, 1, 4096); !status.ok()) return status;
  if (!(alpha > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("lora alpha = ", alpha, " must be > 0"));
  }
  if (targets.empty()) return absl::InvalidArgumentError("lora targets are empty");
  for (const std::string& target : targets) {
    if (std::find(std::begin(kLoraModules), std::end(kLoraModules), target) ==
        std::end(kLoraModules)) {
      return absl::InvalidArgumentError(absl::StrCat("lora target '", target, "' is not one of ",
                                                     absl::StrJoin(kLoraModules, ", ")));
    }
  }
  return absl::OkStatus();
}

std::string LoraConfig::ToJson() const {
  return json{{"rank", rank},
              {"alpha", alpha},
              {"targets", targets},
              {"expert_layout", std::string(ExpertLayoutName(expert_layout))}}
      .dump();
}

absl::StatusOr<LoraConfig> LoraConfig::FromJson(const std::string& text) {
  auto object = ParseObject(text);
  if (!object.ok()) return object.status();
  LoraConfig config;
  std::string layout = "per_expert";
  for (absl::Status status :
       {Read(*object, "rank", config.rank), Read(*object, "alpha", config.alpha),
        Read(*object, "targets", config.targets), Read(*object, "expert_layout", layout)}) {
    if (!status.ok()) return status;
  }
  auto parsed_layout = ExpertLayoutFromName(layout);
  if (!parsed_layout.ok()) return parsed_layout.status();
  config.expert_layout = *parsed_layout;
  if (absl::Status status = config.Validate(); !status.ok()) return status;
  return config;
}

ModelConfig DefaultModelConfig() {
  ModelConfig config;
  config.vocab_size = kVocabSize;
  return config;
}

ModelConfig ScaledDefaultModelConfig(int d_model, int num_layers, int num_experts, int top_k) {
  ModelConfig config = DefaultModelConfig();
  if (d_model > 0) {
    config.dense_ffn_dim = config.dense_ffn_dim * d_model / config.d_model;
    config.expert_ffn_dim = config.expert_ffn_dim * d_model / config.d_model;
    config.num_heads = std::max(1, config.num_heads * d_model / config.d_model);
    config.d_model = d_model;
  }
  if (num_layers > 0) config.num_layers = num_layers;
  if (num_experts > 0) config.num_experts = num_experts;
  if (top_k > 0) config.top_k = top_k;
  return config;
}

}  // namespace tandem::engine
