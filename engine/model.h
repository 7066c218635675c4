#ifndef TANDEM_ENGINE_MODEL_H_
#define TANDEM_ENGINE_MODEL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/config.h"
#include "engine/parameters.h"

namespace tandem::engine {

// Rollout may run in bf16 (weights and activations rounded) or with FP8 E4M3 linear layers
// (weights per output channel, inputs per token, fake-quantized over bf16, as vLLM/SGLang run
// FP8 MoE models) while the trainer runs fp32; the difference reproduces real
// training-inference mismatch. Transformer rounds activations; BaseModel::ForPrecision weights.
// LoRA weights stay bf16 but read the same (quantized) input as the base layer, where vLLM's
// LoRA reads the bf16 input: a small difference of the emulation.
// How a rollout computes: fp32 (as training), bf16 weights and activations, FP8 (bf16 plus E4M3
// linear layers) or INT8 (bf16 plus INT8 weight-only linear layers, W8A16).
enum class Precision { kF32, kBF16, kFP8, kInt8 };

// "fp32", "bf16", "fp8", "int8"; INVALID_ARGUMENT naming any other.
absl::StatusOr<Precision> PrecisionFromName(absl::string_view name);

// Base weights under canonical (Hugging Face / PEFT style) names, e.g.
// "model.layers.{l}.self_attn.q_proj.weight", "model.layers.{l}.mlp.gate.weight" (router),
// "model.layers.{l}.mlp.experts.{e}.down_proj.weight".
class BaseModel {
 public:
  // Random initialization (normal, std 0.02; norms 1; output projections scaled down by
  // depth as in GPT-2 so the residual stream starts tame).
  static absl::StatusOr<BaseModel> Create(const ModelConfig& config, uint64_t seed);
  static absl::StatusOr<BaseModel> Load(const std::string& path);
  // From tensors under the canonical names (stacked experts one tensor per expert, as Save
  // writes them); INVALID_ARGUMENT for a bad config or a missing, unexpected or misshapen
  // tensor.
  static absl::StatusOr<BaseModel> FromTensors(const ModelConfig& config,
                                               const SafetensorsFile& file);
  absl::Status Save(const std::string& path) const;

  // A copy with every weight rounded to bf16, for the bf16 inference mode.
  BaseModel RoundedToBf16() const;
  // The copy a rollout of `precision` serves: as is (fp32), rounded to bf16, or rounded to bf16
  // with every linear projection's weight (*_proj.weight and kv_a_proj_with_mqa: attention,
  // MLPs, experts; not the router, norms, embeddings or LM head) fake-quantized to FP8 E4M3 per
  // output channel.
  BaseModel ForPrecision(Precision precision) const;
  // A copy holding only the routed `experts` (global ids, in that order;
  // ParameterSet::ExpertShard): what an expert-parallel rank computes with. INVALID_ARGUMENT for
  // an expert not held, or one given twice. (first, count): experts [first, first + count).
  absl::StatusOr<BaseModel> ExpertShard(const std::vector<int>& experts) const;
  absl::StatusOr<BaseModel> ExpertShard(int first, int count) const;

  const ModelConfig& config() const { return config_; }
  ParameterSet& parameters() { return parameters_; }
  const ParameterSet& parameters() const { return parameters_; }

 private:
  explicit BaseModel(const ModelConfig& config);
  BaseModel(const ModelConfig& config, ParameterSet parameters)
      : config_(config), parameters_(std::move(parameters)) {}

  ModelConfig config_;
  ParameterSet parameters_;
};

// Where one LoRA-adapted projection's A [.., rank, in] and B [.., out, rank] lie among an
// adapter's parameters, and how row groups (experts) step through them. The expert layouts
// (docs/engine.md) are all per-group strides: per_expert: A rank·in, B out·rank; shared: both 0;
// shared_outer: gate/up A 0 and B out·rank, down A rank·in and B 0.
struct LoraProjectionLayout {
  std::string a;  // Parameter names.
  std::string b;
  int64_t a_group_stride = 0;  // Elements between consecutive groups' A; 0: one A for all.
  int64_t b_group_stride = 0;
  int rank = 0;
  float scale = 0;  // alpha / rank, applied exactly once.
};

// A LoRA adapter for a BaseModel of `model_config`. Names follow PEFT, e.g.
// "model.layers.{l}.self_attn.q_proj.lora_A.weight" and, for experts,
// "model.layers.{l}.mlp.experts.{e}.down_proj.lora_B.weight" (per-expert side) or
// "model.layers.{l}.mlp.experts.down_proj.lora_B.weight" (side shared by all experts).
class LoraAdapter {
 public:
  // A ~ N(0, 1/in), B = 0: the adapted model starts equal to the base model.
  static absl::StatusOr<LoraAdapter> Create(const ModelConfig& model_config,
                                            const LoraConfig& lora_config, uint64_t seed);
  // Every tensor zero, for a caller that fills them (drawing A would be wasted work).
  static absl::StatusOr<LoraAdapter> Zeros(const ModelConfig& model_config,
                                           const LoraConfig& lora_config);
  // The LoRA config travels in the file's metadata; the model config must match the one
  // the adapter was made for (FAILED_PRECONDITION otherwise).
  static absl::StatusOr<LoraAdapter> Load(const std::string& path, const ModelConfig& model_config);
  absl::Status Save(const std::string& path) const;
  SafetensorsFile ToSafetensors() const;
  static absl::StatusOr<LoraAdapter> FromSafetensors(const SafetensorsFile& file,
                                                     const ModelConfig& model_config);
  // From tensors under the canonical names (as ToSafetensors writes them), F32.
  // INVALID_ARGUMENT for a bad config or a missing, unexpected or misshapen tensor.
  static absl::StatusOr<LoraAdapter> FromTensors(const std::map<std::string, Tensor>& tensors,
                                                 const ModelConfig& model_config,
                                                 const LoraConfig& lora_config);

  LoraAdapter RoundedToBf16() const;
  // A copy holding only the per-expert tensors of `experts` (global ids, in that order), or of
  // experts [first, first + count); tensors shared by all experts stay whole. INVALID_ARGUMENT
  // for an expert not held, or one given twice.
  absl::StatusOr<LoraAdapter> ExpertShard(const std::vector<int>& experts) const;
  absl::StatusOr<LoraAdapter> ExpertShard(int first, int count) const;

  // The adapter of `module` ("q_proj", ..., "down_proj") in `layer`, or nullopt when that
  // module is not a target. Expert projections of MoE layers have one group per expert.
  std::optional<LoraProjectionLayout> ProjectionLayout(int layer, absl::string_view module) const;

  const LoraConfig& config() const { return lora_config_; }
  const ModelConfig& model_config() const { return model_config_; }
  ParameterSet& parameters() { return parameters_; }
  const ParameterSet& parameters() const { return parameters_; }

 private:
  LoraAdapter(const ModelConfig& model_config, const LoraConfig& lora_config);
  LoraAdapter(const ModelConfig& model_config, const LoraConfig& lora_config,
              ParameterSet parameters)
      : model_config_(model_config),
        lora_config_(lora_config),
        parameters_(std::move(parameters)) {}

  ModelConfig model_config_;
  LoraConfig lora_config_;
  ParameterSet parameters_;
};

// Canonical name of a base projection's weight, e.g. (2, "q_proj") ->
// "model.layers.2.self_attn.q_proj.weight"; expert projections of MoE layers name the
// stacked tensor "model.layers.{l}.mlp.experts.{module}.weight".
std::string ProjectionName(const ModelConfig& config, int layer, absl::string_view module);

// The LM head's weight: "lm_head.weight", or the token embedding when they are tied.
std::string HeadWeightName(const ModelConfig& config);

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_MODEL_H_
