#include "engine/model.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/safetensors.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/int8.h"

namespace tandem::engine {
namespace {

constexpr char kModelConfigKey[] = "tandem.model_config";
constexpr char kLoraConfigKey[] = "tandem.lora_config";
constexpr float kInitStddev = 0.02f;

bool IsAttention(absl::string_view module) {
  return module == "q_proj" || module == "k_proj" || module == "v_proj" || module == "o_proj";
}

std::string LayerPrefix(int layer) { return absl::StrCat("model.layers.", layer, "."); }

// {out, in} of a projection's weight.
std::pair<int64_t, int64_t> ProjectionShape(const ModelConfig& config, int layer,
                                            absl::string_view module) {
  const int64_t d = config.d_model;
  if (module == "q_proj") return {config.q_dim(), d};
  if (module == "k_proj" || module == "v_proj") return {config.kv_dim(), d};
  if (module == "o_proj") return {d, config.attention_out_dim()};
  const int64_t ffn = config.IsMoeLayer(layer) ? config.expert_ffn_dim : config.dense_ffn_dim;
  return module == "down_proj" ? std::pair{d, ffn} : std::pair{ffn, d};
}

// DeepSeek's latent attention (see ModelConfig), under transformers' names.
void AddLatentAttention(const ModelConfig& config, const std::string& prefix,
                        ParameterSet& parameters) {
  const int64_t d = config.d_model, heads = config.num_heads, latent = config.kv_lora_rank;
  const int64_t qk = config.qk_nope_head_dim + config.qk_rope_head_dim;
  if (config.q_lora_rank > 0) {
    parameters.Add(prefix + "q_a_proj.weight", {config.q_lora_rank, d});
    parameters.Add(prefix + "q_a_layernorm.weight", {config.q_lora_rank});
    parameters.Add(prefix + "q_b_proj.weight", {heads * qk, config.q_lora_rank});
  } else {
    parameters.Add(prefix + "q_proj.weight", {heads * qk, d});
  }
  parameters.Add(prefix + "kv_a_proj_with_mqa.weight", {latent + config.qk_rope_head_dim, d});
  parameters.Add(prefix + "kv_a_layernorm.weight", {latent});
  parameters.Add(prefix + "kv_b_proj.weight",
                 {heads * (config.qk_nope_head_dim + config.v_head_dim), latent});
}

// LoRA adapts q/k/v_proj of standard attention only: latent attention has no such projections.
absl::Status CheckLoraTargets(const ModelConfig& model, const LoraConfig& lora) {
  if (!model.latent_attention()) return absl::OkStatus();
  for (const char* module : {"q_proj", "k_proj", "v_proj"}) {
    if (lora.Targets(module)) {
      return absl::InvalidArgumentError(
          absl::StrCat("lora target ", module,
                       " does not exist in latent attention; target o_proj, "
                       "gate_proj, up_proj and down_proj"));
    }
  }
  return absl::OkStatus();
}

void RoundAll(ParameterSet& parameters) {
  for (const std::string& name : parameters.names()) {
    for (float& value : parameters.Find(name)->value) value = ToFloat(ToBFloat16(value));
  }
}

absl::StatusOr<ModelConfig> ModelConfigOf(const SafetensorsFile& file, const std::string& path) {
  auto found = file.metadata.find(kModelConfigKey);
  if (found == file.metadata.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' has no '", kModelConfigKey, "' metadata"));
  }
  return ModelConfig::FromJson(found->second);
}

}  // namespace

std::string HeadWeightName(const ModelConfig& config) {
  return config.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
}

std::string ProjectionName(const ModelConfig& config, int layer, absl::string_view module) {
  if (IsAttention(module)) return absl::StrCat(LayerPrefix(layer), "self_attn.", module, ".weight");
  if (config.IsMoeLayer(layer))
    return absl::StrCat(LayerPrefix(layer), "mlp.experts.", module, ".weight");
  return absl::StrCat(LayerPrefix(layer), "mlp.", module, ".weight");
}

BaseModel::BaseModel(const ModelConfig& config) : config_(config) {
  const int64_t d = config.d_model;
  const int64_t experts = config.num_experts;
  parameters_.Add("model.embed_tokens.weight", {config.vocab_size, d});
  for (int layer = 0; layer < config.num_layers; ++layer) {
    const std::string prefix = LayerPrefix(layer);
    parameters_.Add(prefix + "input_layernorm.weight", {d});
    if (config.latent_attention()) {
      AddLatentAttention(config, prefix + "self_attn.", parameters_);
    } else {
      for (const char* module : {"q_proj", "k_proj", "v_proj"}) {
        const auto [out, in] = ProjectionShape(config, layer, module);
        parameters_.Add(ProjectionName(config, layer, module), {out, in});
      }
    }
    const auto [o_out, o_in] = ProjectionShape(config, layer, "o_proj");
    parameters_.Add(ProjectionName(config, layer, "o_proj"), {o_out, o_in});
    if (config.qk_norm != QkNorm::kNone) {
      const bool per_head = config.qk_norm == QkNorm::kPerHead;
      parameters_.Add(prefix + "self_attn.q_norm.weight",
                      {per_head ? config.head_dim() : config.q_dim()});
      parameters_.Add(prefix + "self_attn.k_norm.weight",
                      {per_head ? config.head_dim() : config.kv_dim()});
    }
    parameters_.Add(prefix + "post_attention_layernorm.weight", {d});
    for (const char* module : {"gate_proj", "up_proj", "down_proj"}) {
      const auto [out, in] = ProjectionShape(config, layer, module);
      if (config.IsMoeLayer(layer)) {
        parameters_.AddStackedExperts(ProjectionName(config, layer, module), {experts, out, in},
                                      config.MoeIndex(layer));
      } else {
        parameters_.Add(ProjectionName(config, layer, module), {out, in});
      }
    }
    if (!config.IsMoeLayer(layer)) continue;
    parameters_.Add(prefix + "mlp.gate.weight", {experts, d});
    if (config.scoring == kernels::ScoringFunction::kSigmoid) {
      parameters_.Add(prefix + "mlp.gate.e_score_correction_bias", {experts});
    }
    if (config.num_shared_experts > 0) {
      const int64_t shared_ffn = config.shared_expert_ffn_dim();
      parameters_.Add(prefix + "mlp.shared_experts.gate_proj.weight", {shared_ffn, d});
      parameters_.Add(prefix + "mlp.shared_experts.up_proj.weight", {shared_ffn, d});
      parameters_.Add(prefix + "mlp.shared_experts.down_proj.weight", {d, shared_ffn});
    }
  }
  parameters_.Add("model.norm.weight", {d});
  if (!config.tie_word_embeddings) parameters_.Add("lm_head.weight", {config.vocab_size, d});
}

absl::StatusOr<BaseModel> BaseModel::Create(const ModelConfig& config, uint64_t seed) {
  if (absl::Status status = config.Validate(); !status.ok()) return status;
  BaseModel model(config);
  std::mt19937_64 rng(seed);
  const float residual_stddev = kInitStddev / std::sqrt(2.0f * config.num_layers);
  for (const std::string& name : model.parameters_.names()) {
    Parameter& parameter = *model.parameters_.Find(name);
    if (name.ends_with("norm.weight")) {
      ParameterSet::Fill(parameter, 1.0f);
    } else if (name.ends_with("e_score_correction_bias")) {
      ParameterSet::Fill(parameter, 0.0f);
    } else if (name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight")) {
      ParameterSet::FillNormal(parameter, residual_stddev, rng);
    } else {
      ParameterSet::FillNormal(parameter, kInitStddev, rng);
    }
  }
  return model;
}

absl::StatusOr<BaseModel> BaseModel::Load(const std::string& path) {
  auto file = ReadSafetensors(path);
  if (!file.ok()) return file.status();
  auto config = ModelConfigOf(*file, path);
  if (!config.ok()) return config.status();
  auto model = FromTensors(*config, *file);
  if (!model.ok()) {
    return absl::Status(model.status().code(),
                        absl::StrCat("'", path, "': ", model.status().message()));
  }
  return model;
}

absl::StatusOr<BaseModel> BaseModel::FromTensors(const ModelConfig& config,
                                                 const SafetensorsFile& file) {
  if (absl::Status status = config.Validate(); !status.ok()) return status;
  BaseModel model(config);
  if (absl::Status status = model.parameters_.LoadFrom(file); !status.ok()) return status;
  return model;
}

absl::Status BaseModel::Save(const std::string& path) const {
  SafetensorsFile file = parameters_.ToSafetensors();
  file.metadata[kModelConfigKey] = config_.ToJson();
  return WriteSafetensors(path, file);
}

absl::StatusOr<Precision> PrecisionFromName(absl::string_view name) {
  if (name == "fp32") return Precision::kF32;
  if (name == "bf16") return Precision::kBF16;
  if (name == "fp8") return Precision::kFP8;
  if (name == "int8") return Precision::kInt8;
  return absl::InvalidArgumentError(
      absl::StrCat("precision '", name, "' is not fp32, bf16, fp8 or int8"));
}

BaseModel BaseModel::ForPrecision(Precision precision) const {
  if (precision == Precision::kF32) return *this;
  BaseModel rounded = RoundedToBf16();
  if (precision == Precision::kBF16) return rounded;
  // The linear projections' weights, per output channel; the router, norms, embeddings and LM
  // head stay bf16, as inference engines quantize MoE models.
  for (const std::string& name : rounded.parameters_.names()) {
    if (!name.ends_with("_proj.weight") && !name.ends_with("_proj_with_mqa.weight")) continue;
    Parameter& weight = *rounded.parameters_.Find(name);
    const int64_t in = weight.shape.back();
    if (precision == Precision::kFP8) {
      cpu::QuantizeRowsToE4M3(weight.value.data(), weight.size() / in, in);
    } else {
      cpu::QuantizeRowsToInt8(weight.value.data(), weight.size() / in, in);
    }
  }
  return rounded;
}

namespace {

// INVALID_ARGUMENT unless `experts` are distinct global ids, each held by every stacked tensor of
// `parameters`.
absl::Status CheckExpertShard(const ModelConfig& config, const ParameterSet& parameters,
                              const std::vector<int>& experts) {
  if (experts.empty()) return absl::InvalidArgumentError("an expert shard of no experts");
  std::vector<bool> seen(config.num_experts, false);
  for (int expert : experts) {
    if (expert < 0 || expert >= config.num_experts || seen[expert]) {
      return absl::InvalidArgumentError(absl::StrCat("expert ", expert, " is not one of the ",
                                                     config.num_experts, " (or comes twice)"));
    }
    seen[expert] = true;
  }
  for (const std::string& name : parameters.names()) {
    const Parameter& parameter = *parameters.Find(name);
    if (!parameter.stacked_experts) continue;
    for (int expert : experts) {
      if (parameter.StackedIndex(expert) < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("expert ", expert, " is not held by this shard's '", name, "'"));
      }
    }
  }
  return absl::OkStatus();
}

std::vector<int> ExpertRange(int first, int count) {
  std::vector<int> experts(std::max(count, 0));
  std::iota(experts.begin(), experts.end(), first);
  return experts;
}

}  // namespace

absl::StatusOr<BaseModel> BaseModel::ExpertShard(const std::vector<int>& experts) const {
  if (absl::Status status = CheckExpertShard(config_, parameters_, experts); !status.ok()) {
    return status;
  }
  BaseModel shard(config_, parameters_.ExpertShard(experts));
  return shard;
}

absl::StatusOr<BaseModel> BaseModel::ExpertShard(int first, int count) const {
  return ExpertShard(ExpertRange(first, count));
}

absl::StatusOr<LoraAdapter> LoraAdapter::ExpertShard(const std::vector<int>& experts) const {
  if (absl::Status status = CheckExpertShard(model_config_, parameters_, experts); !status.ok()) {
    return status;
  }
  LoraAdapter shard(model_config_, lora_config_, parameters_.ExpertShard(experts));
  return shard;
}

absl::StatusOr<LoraAdapter> LoraAdapter::ExpertShard(int first, int count) const {
  return ExpertShard(ExpertRange(first, count));
}

BaseModel BaseModel::RoundedToBf16() const {
  BaseModel rounded = *this;
  RoundAll(rounded.parameters_);
  return rounded;
}

LoraAdapter::LoraAdapter(const ModelConfig& model_config, const LoraConfig& lora_config)
    : model_config_(model_config), lora_config_(lora_config) {
  const int64_t rank = lora_config.rank;
  const int64_t experts = model_config.num_experts;
  for (int layer = 0; layer < model_config.num_layers; ++layer) {
    for (const std::string& module : lora_config.targets) {
      const auto [out, in] = ProjectionShape(model_config, layer, module);
      const std::string base = ProjectionName(model_config, layer, module);
      const std::string stem = base.substr(0, base.size() - std::string(".weight").size());
      const bool experts_here = !IsAttention(module) && model_config.IsMoeLayer(layer);
      const ExpertLayout layout = lora_config.expert_layout;
      // shared_outer: gate/up share A (their input side), down shares B (its output side).
      const bool a_per_expert =
          experts_here && (layout == ExpertLayout::kPerExpert ||
                           (layout == ExpertLayout::kSharedOuter && module == "down_proj"));
      const bool b_per_expert =
          experts_here && (layout == ExpertLayout::kPerExpert ||
                           (layout == ExpertLayout::kSharedOuter && module != "down_proj"));
      if (a_per_expert) {
        parameters_.AddStackedExperts(stem + ".lora_A.weight", {experts, rank, in},
                                      model_config.MoeIndex(layer));
      } else {
        parameters_.Add(stem + ".lora_A.weight", {rank, in});
      }
      if (b_per_expert) {
        parameters_.AddStackedExperts(stem + ".lora_B.weight", {experts, out, rank},
                                      model_config.MoeIndex(layer));
      } else {
        parameters_.Add(stem + ".lora_B.weight", {out, rank});
      }
    }
  }
}

absl::StatusOr<LoraAdapter> LoraAdapter::Zeros(const ModelConfig& model_config,
                                               const LoraConfig& lora_config) {
  if (absl::Status status = model_config.Validate(); !status.ok()) return status;
  if (absl::Status status = lora_config.Validate(); !status.ok()) return status;
  if (absl::Status status = CheckLoraTargets(model_config, lora_config); !status.ok()) {
    return status;
  }
  return LoraAdapter(model_config, lora_config);
}

absl::StatusOr<LoraAdapter> LoraAdapter::Create(const ModelConfig& model_config,
                                                const LoraConfig& lora_config, uint64_t seed) {
  auto created = Zeros(model_config, lora_config);
  if (!created.ok()) return created.status();
  LoraAdapter& adapter = *created;
  std::mt19937_64 rng(seed);
  for (const std::string& name : adapter.parameters_.names()) {
    Parameter& parameter = *adapter.parameters_.Find(name);
    if (name.ends_with("lora_A.weight")) {
      ParameterSet::FillNormal(parameter, 1.0f / std::sqrt(parameter.shape.back()), rng);
    }
  }
  return created;
}

SafetensorsFile LoraAdapter::ToSafetensors() const {
  SafetensorsFile file = parameters_.ToSafetensors();
  file.metadata[kModelConfigKey] = model_config_.ToJson();
  file.metadata[kLoraConfigKey] = lora_config_.ToJson();
  return file;
}

absl::StatusOr<LoraAdapter> LoraAdapter::FromSafetensors(const SafetensorsFile& file,
                                                         const ModelConfig& model_config) {
  auto adapter_model = ModelConfigOf(file, "adapter");
  if (!adapter_model.ok()) return adapter_model.status();
  if (adapter_model->ToJson() != model_config.ToJson()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "adapter was made for model ", adapter_model->ToJson(), ", not ", model_config.ToJson()));
  }
  auto found = file.metadata.find(kLoraConfigKey);
  if (found == file.metadata.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("adapter has no '", kLoraConfigKey, "' metadata"));
  }
  auto lora_config = LoraConfig::FromJson(found->second);
  if (!lora_config.ok()) return lora_config.status();
  return FromTensors(file.tensors, model_config, *lora_config);
}

absl::StatusOr<LoraAdapter> LoraAdapter::FromTensors(const std::map<std::string, Tensor>& tensors,
                                                     const ModelConfig& model_config,
                                                     const LoraConfig& lora_config) {
  auto adapter = Zeros(model_config, lora_config);
  if (!adapter.ok()) return adapter.status();
  if (absl::Status status = adapter->parameters_.LoadFrom({tensors, {}}); !status.ok()) {
    return status;
  }
  return adapter;
}

absl::StatusOr<LoraAdapter> LoraAdapter::Load(const std::string& path,
                                              const ModelConfig& model_config) {
  auto file = ReadSafetensors(path);
  if (!file.ok()) return file.status();
  auto adapter = FromSafetensors(*file, model_config);
  if (!adapter.ok()) {
    return absl::Status(adapter.status().code(),
                        absl::StrCat("'", path, "': ", adapter.status().message()));
  }
  return adapter;
}

absl::Status LoraAdapter::Save(const std::string& path) const {
  return WriteSafetensors(path, ToSafetensors());
}

LoraAdapter LoraAdapter::RoundedToBf16() const {
  LoraAdapter rounded = *this;
  RoundAll(rounded.parameters_);
  return rounded;
}

std::optional<LoraProjectionLayout> LoraAdapter::ProjectionLayout(int layer,
                                                                  absl::string_view module) const {
  if (!lora_config_.Targets(module)) return std::nullopt;
  const std::string base = ProjectionName(model_config_, layer, module);
  const std::string stem = base.substr(0, base.size() - std::string(".weight").size());
  LoraProjectionLayout layout{.a = stem + ".lora_A.weight", .b = stem + ".lora_B.weight"};
  const Parameter& a = *parameters_.Find(layout.a);
  const Parameter& b = *parameters_.Find(layout.b);
  layout.a_group_stride = a.stacked_experts ? a.size() / a.shape[0] : 0;
  layout.b_group_stride = b.stacked_experts ? b.size() / b.shape[0] : 0;
  layout.rank = lora_config_.rank;
  layout.scale = lora_config_.scale();
  return layout;
}

}  // namespace tandem::engine
