#ifndef TANDEM_ENGINE_TESTING_TEST_MODELS_H_
#define TANDEM_ENGINE_TESTING_TEST_MODELS_H_

#include <cstdint>
#include <vector>

#include "engine/config.h"
#include "engine/model.h"
#include "engine/transformer.h"

// Small models of every architecture the engine supports, for tests that compare the engine's
// paths with each other (CPU forward vs backward, full forward vs KV-cache decode, CPU vs GPU).
namespace tandem::engine::test_models {

// The embedded model's shape, tiny: a dense layer, then MoE layers with a shared expert.
ModelConfig TinyConfig();
// The shapes of Hugging Face architectures: grouped-query attention with a head size that is not
// d_model / heads, q/k norms per head (Qwen3) or over the whole projection (OLMoE), a dense layer
// between MoE layers, unnormalized top-k gates, a tied LM head and YaRN.
ModelConfig QwenShapedConfig();
ModelConfig OlmoeShapedConfig();
// DeepSeek-V3's MoE block: sigmoid scores with a selection-only bias, group-limited routing,
// scaled gate weights, two shared experts, a leading dense layer.
ModelConfig DeepseekShapedConfig();
// DeepSeek-V3's latent attention (queries through a low-rank pair, YaRN with mscale_all_dim,
// interleaved rotary pairs) with its MoE block.
ModelConfig DeepseekV3ShapedConfig();

struct NamedConfig {
  const char* name;
  ModelConfig (*make)();
};
inline constexpr NamedConfig kConfigs[] = {{"Embedded", TinyConfig},
                                           {"QwenShaped", QwenShapedConfig},
                                           {"OlmoeShaped", OlmoeShapedConfig},
                                           {"DeepseekShaped", DeepseekShapedConfig},
                                           {"DeepseekV3Shaped", DeepseekV3ShapedConfig}};

// kConfigs without latent attention: what the CUDA engine runs.
std::vector<NamedConfig> StandardAttentionConfigs();

// LoRA on every projection the model has: latent attention has no q/k/v_proj.
LoraConfig TestLora(const ModelConfig& model);

// Random weights larger than the default init, so every path carries signal.
BaseModel RandomModel(const ModelConfig& config, uint64_t seed);
void RandomizeLora(LoraAdapter& adapter, uint64_t seed);

// Every parameter's gradient, in name order, end to end.
std::vector<float> Gradients(const ParameterSet& parameters);

// Two packed sequences of 7 and 5 tokens (ids < 20).
TokenBatch TwoSequences();

}  // namespace tandem::engine::test_models

#endif  // TANDEM_ENGINE_TESTING_TEST_MODELS_H_
