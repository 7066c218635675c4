#include "engine/peft_adapter.h"

#include <cmath>
#include <fstream>
#include <random>
#include <vector>

#include "common/safetensors.h"
#include "engine/cpu_model_ops.h"
#include "engine/transformer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem::engine {
namespace {

using ::testing::HasSubstr;

// One dense and two MoE layers of three experts (an odd count, so per-expert copies are not
// mistaken for pairs).
ModelConfig SmallConfig() {
  ModelConfig config = DefaultModelConfig();
  config.d_model = 24;
  config.num_layers = 3;
  config.num_experts = 3;
  config.top_k = 2;
  config.expert_ffn_dim = 12;
  config.dense_ffn_dim = 32;
  return config;
}

std::string Directory(const std::string& name) { return ::testing::TempDir() + "/peft_" + name; }

// A trained-looking adapter: B is not zero, so the adapter changes the model's output.
LoraAdapter TrainedAdapter(ExpertLayout layout) {
  LoraConfig lora;
  lora.rank = 4;
  lora.alpha = 8;
  lora.expert_layout = layout;
  LoraAdapter adapter = *LoraAdapter::Create(SmallConfig(), lora, 3);
  std::mt19937_64 rng(5);
  for (const std::string& name : adapter.parameters().names()) {
    if (name.ends_with("lora_B.weight")) {
      ParameterSet::FillNormal(*adapter.parameters().Find(name), 0.05f, rng);
    }
  }
  return adapter;
}

std::vector<float> Logits(BaseModel& base, LoraAdapter& adapter) {
  Transformer transformer(base, &adapter, std::make_unique<CpuModelOps>(base.config()));
  TokenBatch batch;
  batch.Add({1, 5, 6, 17, 9, 4, 13});
  batch.Add({1, 8, 8, 20, 3});
  const float* logits = *transformer.Forward(batch);
  return {logits, logits + int64_t{batch.num_tokens()} * base.config().vocab_size};
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream file(path);
  return nlohmann::json::parse(file);
}

void WriteJson(const std::string& path, const nlohmann::json& json) {
  std::ofstream(path) << json.dump();
}

TEST(PeftAdapterTest, APerExpertAdapterRoundTripsBitForBit) {
  const LoraAdapter adapter = TrainedAdapter(ExpertLayout::kPerExpert);
  ASSERT_TRUE(WritePeftAdapter(adapter, Directory("per_expert"), "tandem/addition-moe").ok());
  auto read = ReadPeftAdapter(Directory("per_expert"), SmallConfig());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->ToSafetensors().tensors, adapter.ToSafetensors().tensors);
  EXPECT_EQ(read->config().rank, 4);
  EXPECT_EQ(read->config().alpha, 8.0f);
}

class SharedLayoutTest : public ::testing::TestWithParam<ExpertLayout> {};

TEST_P(SharedLayoutTest, SharedSidesAreCopiedPerExpertAndComputeTheSameFunction) {
  BaseModel base = *BaseModel::Create(SmallConfig(), 1);
  LoraAdapter adapter = TrainedAdapter(GetParam());
  const std::string directory = Directory(std::string(ExpertLayoutName(GetParam())));
  ASSERT_TRUE(WritePeftAdapter(adapter, directory, "base").ok());
  auto read = ReadPeftAdapter(directory, SmallConfig());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->config().expert_layout, ExpertLayout::kPerExpert);
  const std::vector<float> expected = Logits(base, adapter);
  const std::vector<float> actual = Logits(base, *read);
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_NEAR(actual[i], expected[i], 1e-5f * (1 + std::abs(expected[i]))) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, SharedLayoutTest,
                         ::testing::Values(ExpertLayout::kShared, ExpertLayout::kSharedOuter));

// The conventions of PEFT (peft/utils/constants.py: adapter_config.json and
// adapter_model.safetensors; peft/utils/save_and_load.py: keys without the adapter name;
// peft/tuners/lora/config.py: r, lora_alpha, target_modules, use_rslora, ...) and of vLLM's
// loader (vllm/lora/utils.py parse_fine_tuned_lora_name: a "base_model.model." prefix, then
// the module path, then "lora_A.weight" or "lora_B.weight").
TEST(PeftAdapterTest, NamesAndConfigKeysFollowPeftAndVllm) {
  ASSERT_TRUE(WritePeftAdapter(TrainedAdapter(ExpertLayout::kShared), Directory("names"),
                               "tandem/addition-moe")
                  .ok());
  const nlohmann::json config = ReadJson(Directory("names") + "/adapter_config.json");
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["task_type"], "CAUSAL_LM");
  EXPECT_EQ(config["r"], 4);
  EXPECT_EQ(config["lora_alpha"], 8.0);
  EXPECT_EQ(config["base_model_name_or_path"], "tandem/addition-moe");
  EXPECT_EQ(config["target_modules"].size(), 7);
  auto file = ReadSafetensors(Directory("names") + "/adapter_model.safetensors");
  ASSERT_TRUE(file.ok());
  const std::vector<int64_t> expected_shape = {24, 4};  // [out, r] of an expert's down_proj.
  ASSERT_TRUE(file->tensors.contains(
      "base_model.model.model.layers.2.mlp.experts.2.down_proj.lora_B.weight"));
  EXPECT_EQ(
      file->tensors.at("base_model.model.model.layers.2.mlp.experts.2.down_proj.lora_B.weight")
          .shape(),
      expected_shape);
  EXPECT_TRUE(
      file->tensors.contains("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));
  for (const auto& [name, tensor] : file->tensors) {
    EXPECT_TRUE(name.starts_with("base_model.model.model.layers.")) << name;
    EXPECT_TRUE(name.ends_with(".lora_A.weight") || name.ends_with(".lora_B.weight")) << name;
    EXPECT_EQ(name.find(".mlp.experts.gate_proj"), std::string::npos) << name;  // No shared side.
  }
}

// Mixtral's checkpoints call the MoE block block_sparse_moe and its projections w1/w3/w2;
// PEFT matches target_modules against those names, so the adapter must use them.
TEST(PeftAdapterTest, MixtralNamesRoundTripAndAreWhatPeftMatches) {
  LoraAdapter adapter = TrainedAdapter(ExpertLayout::kShared);
  const std::string directory = Directory("mixtral");
  ASSERT_TRUE(
      WritePeftAdapter(adapter, directory, "mistralai/Mixtral-8x7B-v0.1", MixtralModuleNames())
          .ok());
  const nlohmann::json config = ReadJson(directory + "/adapter_config.json");
  EXPECT_THAT(config["target_modules"].get<std::vector<std::string>>(),
              ::testing::IsSupersetOf({"q_proj", "w1", "w3", "w2"}));
  EXPECT_EQ(config["target_modules"].dump().find("gate_proj"), std::string::npos);
  auto file = *ReadSafetensors(directory + "/adapter_model.safetensors");
  EXPECT_TRUE(file.tensors.contains(
      "base_model.model.model.layers.1.block_sparse_moe.experts.2.w1.lora_A.weight"));
  EXPECT_TRUE(file.tensors.contains(
      "base_model.model.model.layers.2.block_sparse_moe.experts.0.w2.lora_B.weight"));
  EXPECT_TRUE(
      file.tensors.contains("base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"));
  for (const auto& [name, tensor] : file.tensors) {
    EXPECT_EQ(name.find(".mlp.experts."), std::string::npos) << name;
  }
  auto read = ReadPeftAdapter(directory, SmallConfig(), MixtralModuleNames());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->config().targets, adapter.config().targets);
  BaseModel base = *BaseModel::Create(SmallConfig(), 1);
  const std::vector<float> expected = Logits(base, adapter);
  const std::vector<float> actual = Logits(base, *read);
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_NEAR(actual[i], expected[i], 1e-5f * (1 + std::abs(expected[i]))) << i;
  }
}

TEST(PeftAdapterTest, Bf16TensorsAreRead) {
  const LoraAdapter adapter = TrainedAdapter(ExpertLayout::kPerExpert);
  const std::string directory = Directory("bf16");
  ASSERT_TRUE(WritePeftAdapter(adapter, directory, "base").ok());
  auto file = *ReadSafetensors(directory + "/adapter_model.safetensors");
  for (auto& [name, tensor] : file.tensors) {
    Tensor bf16 = *Tensor::Create(DType::kBF16, tensor.shape());
    auto values = *tensor.data<float>();
    auto out = *bf16.mutable_data<BFloat16>();
    for (size_t i = 0; i < values.size(); ++i) out[i] = ToBFloat16(values[i]);
    tensor = std::move(bf16);
  }
  ASSERT_TRUE(WriteSafetensors(directory + "/adapter_model.safetensors", file).ok());
  auto read = ReadPeftAdapter(directory, SmallConfig());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->parameters().names(), adapter.parameters().names());
}

TEST(PeftAdapterTest, WhatWouldComputeDifferentlyIsRefusedByKey) {
  const std::string directory = Directory("refused");
  ASSERT_TRUE(WritePeftAdapter(TrainedAdapter(ExpertLayout::kPerExpert), directory, "b").ok());
  const nlohmann::json original = ReadJson(directory + "/adapter_config.json");
  const std::vector<std::pair<std::string, nlohmann::json>> refused = {
      {"use_rslora", true},
      {"use_dora", true},
      {"bias", "all"},
      {"fan_in_fan_out", true},
      {"rank_pattern", {{"q_proj", 8}}},
      {"target_modules", ".*(q_proj|v_proj)$"},
      {"target_modules", {"q_proj", "lm_head"}},
      {"peft_type", "LOHA"},
      {"r", "four"},
  };
  for (const auto& [key, value] : refused) {
    nlohmann::json config = original;
    config[key] = value;
    WriteJson(directory + "/adapter_config.json", config);
    auto read = ReadPeftAdapter(directory, SmallConfig());
    ASSERT_FALSE(read.ok()) << key;
    EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument) << key;
    EXPECT_THAT(read.status().message(), HasSubstr(key == "r" ? "adapter_config.json" : key));
  }
}

TEST(PeftAdapterTest, AMissingTensorOrFileIsNamed) {
  const std::string directory = Directory("missing");
  ASSERT_TRUE(WritePeftAdapter(TrainedAdapter(ExpertLayout::kPerExpert), directory, "b").ok());
  auto file = *ReadSafetensors(directory + "/adapter_model.safetensors");
  file.tensors.erase("base_model.model.model.layers.1.mlp.experts.2.gate_proj.lora_A.weight");
  ASSERT_TRUE(WriteSafetensors(directory + "/adapter_model.safetensors", file).ok());
  auto read = ReadPeftAdapter(directory, SmallConfig());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(read.status().message(), HasSubstr("model.layers.1.mlp.experts.2.gate_proj.lora_A"));
  EXPECT_EQ(ReadPeftAdapter(Directory("nowhere"), SmallConfig()).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tandem::engine
