#include "engine/testing/test_models.h"

#include <random>
#include <string>

namespace tandem::engine::test_models {

ModelConfig TinyConfig() {
  ModelConfig config;
  config.vocab_size = 20;
  config.d_model = 16;
  config.num_heads = 2;
  config.num_layers = 3;
  config.num_dense_layers = 1;
  config.dense_ffn_dim = 16;
  config.num_experts = 4;
  config.top_k = 2;
  config.expert_ffn_dim = 8;
  config.num_shared_experts = 1;
  config.max_seq_len = 16;
  return config;
}

ModelConfig QwenShapedConfig() {
  ModelConfig config = TinyConfig();
  config.num_heads = 4;
  config.num_kv_heads = 2;
  config.attention_head_dim = 6;
  config.qk_norm = QkNorm::kPerHead;
  config.num_dense_layers = 0;
  config.mlp_only_layers = {1};
  config.norm_topk_prob = false;
  config.tie_word_embeddings = true;
  config.num_shared_experts = 0;
  config.rope_yarn = {.factor = 2.0, .original_max_position = 8};
  return config;
}

ModelConfig OlmoeShapedConfig() {
  ModelConfig config = TinyConfig();
  config.num_heads = 4;
  config.num_kv_heads = 1;
  config.qk_norm = QkNorm::kWholeProjection;
  config.num_dense_layers = 0;
  config.num_shared_experts = 0;
  return config;
}

ModelConfig DeepseekShapedConfig() {
  ModelConfig config = TinyConfig();
  config.scoring = kernels::ScoringFunction::kSigmoid;
  config.num_experts = 8;
  config.num_expert_groups = 4;
  config.kept_expert_groups = 2;
  config.routed_scaling_factor = 2.5f;
  config.num_shared_experts = 2;
  return config;
}

ModelConfig DeepseekV3ShapedConfig() {
  ModelConfig config = DeepseekShapedConfig();
  config.kv_lora_rank = 6;
  config.q_lora_rank = 5;
  config.qk_nope_head_dim = 4;
  config.qk_rope_head_dim = 4;
  config.v_head_dim = 3;
  config.rope_yarn = {
      .factor = 4.0, .original_max_position = 4, .mscale = 1.0, .mscale_all_dim = 1.0};
  return config;
}

LoraConfig TestLora(const ModelConfig& model) {
  LoraConfig lora;
  if (model.latent_attention()) lora.targets = {"o_proj", "gate_proj", "up_proj", "down_proj"};
  return lora;
}

BaseModel RandomModel(const ModelConfig& config, uint64_t seed) {
  BaseModel model = *BaseModel::Create(config, seed);
  std::mt19937_64 rng(seed + 1);
  for (const std::string& name : model.parameters().names()) {
    Parameter& parameter = *model.parameters().Find(name);
    if (name.ends_with("norm.weight")) continue;
    ParameterSet::FillNormal(parameter, 0.3f, rng);
  }
  return model;
}

void RandomizeLora(LoraAdapter& adapter, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (const std::string& name : adapter.parameters().names()) {
    ParameterSet::FillNormal(*adapter.parameters().Find(name), 0.3f, rng);
  }
}

TokenBatch TwoSequences() {
  TokenBatch batch;
  batch.Add({1, 5, 7, 3, 9, 11, 2});
  batch.Add({1, 4, 4, 8, 19});
  return batch;
}

std::vector<NamedConfig> StandardAttentionConfigs() {
  std::vector<NamedConfig> configs;
  for (const NamedConfig& config : kConfigs) {
    if (!config.make().latent_attention()) configs.push_back(config);
  }
  return configs;
}

std::vector<float> Gradients(const ParameterSet& parameters) {
  std::vector<float> all;
  for (const std::string& name : parameters.names()) {
    const std::vector<float>& grad = parameters.Find(name)->grad;
    all.insert(all.end(), grad.begin(), grad.end());
  }
  return all;
}

}  // namespace tandem::engine::test_models
