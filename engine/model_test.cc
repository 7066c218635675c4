#include "engine/model.h"

#include <algorithm>
#include <string>
#include <utility>

#include "common/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::engine {
namespace {

using ::testing::HasSubstr;

ModelConfig SmallConfig() {
  ModelConfig config = DefaultModelConfig();
  config.d_model = 16;
  config.num_layers = 3;
  config.num_experts = 4;
  config.expert_ffn_dim = 8;
  config.dense_ffn_dim = 16;
  return config;
}

std::string TempPath(const std::string& name) { return ::testing::TempDir() + "/" + name; }

TEST(ModelTest, SaveLoadRoundTripUsesCanonicalPerExpertNames) {
  BaseModel model = *BaseModel::Create(SmallConfig(), 1);
  const std::string path = TempPath("base.safetensors");
  ASSERT_TRUE(model.Save(path).ok());
  auto file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->tensors.contains("model.layers.1.mlp.experts.3.down_proj.weight"));
  EXPECT_TRUE(file->tensors.contains("model.layers.0.mlp.down_proj.weight"));  // Dense layer.
  EXPECT_TRUE(file->tensors.contains("model.layers.2.mlp.gate.weight"));       // Router.
  EXPECT_FALSE(file->tensors.contains("model.layers.1.mlp.experts.down_proj.weight"));

  auto loaded = BaseModel::Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->config().ToJson(), model.config().ToJson());
  for (const std::string& name : model.parameters().names()) {
    EXPECT_EQ(loaded->parameters().Find(name)->value, model.parameters().Find(name)->value) << name;
  }
}

// An expert-parallel rank's share: its experts only, under their global names.
TEST(ModelTest, AnExpertShardHoldsItsExpertsUnderGlobalNames) {
  BaseModel model = *BaseModel::Create(SmallConfig(), 1);
  absl::StatusOr<BaseModel> shard = model.ExpertShard(2, 2);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_THAT(shard->parameters().held_experts(0), ::testing::ElementsAre(2, 3));
  const std::string stacked = "model.layers.1.mlp.experts.down_proj.weight";
  const Parameter& full = *model.parameters().Find(stacked);
  const Parameter& part = *shard->parameters().Find(stacked);
  EXPECT_EQ(part.shape[0], 2);
  EXPECT_EQ(part.size() * 2, full.size());
  EXPECT_TRUE(
      std::equal(part.value.begin(), part.value.end(), full.value.begin() + full.size() / 2));
  EXPECT_EQ(shard->parameters().Find("model.layers.1.mlp.gate.weight")->value,
            model.parameters().Find("model.layers.1.mlp.gate.weight")->value);  // Router: whole.

  const SafetensorsFile file = shard->parameters().ToSafetensors();
  EXPECT_TRUE(file.tensors.contains("model.layers.1.mlp.experts.2.down_proj.weight"));
  EXPECT_TRUE(file.tensors.contains("model.layers.1.mlp.experts.3.down_proj.weight"));
  EXPECT_FALSE(file.tensors.contains("model.layers.1.mlp.experts.0.down_proj.weight"));
  ParameterSet reloaded = shard->parameters();
  ASSERT_TRUE(reloaded.LoadFrom(file).ok());

  // A shard of the shard names global experts it holds; any order is kept.
  EXPECT_THAT(shard->ExpertShard(3, 1)->parameters().held_experts(0), ::testing::ElementsAre(3));
  for (const auto& [first, count] : {std::pair(3, 2), std::pair(-1, 1), std::pair(0, 0)}) {
    EXPECT_EQ(model.ExpertShard(first, count).status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(shard->ExpertShard(1, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model.ExpertShard({1, 1}).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<BaseModel> scattered = model.ExpertShard({3, 0});
  ASSERT_TRUE(scattered.ok()) << scattered.status();
  const Parameter& reordered = *scattered->parameters().Find(stacked);
  const int64_t expert_size = full.size() / full.shape[0];
  EXPECT_TRUE(std::equal(reordered.value.begin(), reordered.value.begin() + expert_size,
                         full.value.begin() + 3 * expert_size));
  EXPECT_TRUE(
      std::equal(reordered.value.begin() + expert_size, reordered.value.end(), full.value.begin()));
  const SafetensorsFile scattered_file = scattered->parameters().ToSafetensors();
  EXPECT_EQ(scattered_file.tensors.at("model.layers.1.mlp.experts.3.down_proj.weight"),
            file.tensors.at("model.layers.1.mlp.experts.3.down_proj.weight"));
}

TEST(ModelTest, LoadRejectsMissingAndUnexpectedTensors) {
  BaseModel model = *BaseModel::Create(SmallConfig(), 1);
  SafetensorsFile file = model.parameters().ToSafetensors();
  file.metadata["tandem.model_config"] = model.config().ToJson();
  file.tensors.erase("model.layers.2.mlp.experts.1.up_proj.weight");
  ASSERT_TRUE(WriteSafetensors(TempPath("missing.safetensors"), file).ok());
  EXPECT_THAT(BaseModel::Load(TempPath("missing.safetensors")).status().message(),
              HasSubstr("missing tensor 'model.layers.2.mlp.experts.1.up_proj.weight'"));

  file = model.parameters().ToSafetensors();
  file.metadata["tandem.model_config"] = model.config().ToJson();
  file.tensors["model.extra.weight"] = file.tensors.at("model.norm.weight");
  ASSERT_TRUE(WriteSafetensors(TempPath("extra.safetensors"), file).ok());
  EXPECT_THAT(BaseModel::Load(TempPath("extra.safetensors")).status().message(),
              HasSubstr("unexpected tensor 'model.extra.weight'"));
}

class AdapterLayoutTest : public ::testing::TestWithParam<ExpertLayout> {};

TEST_P(AdapterLayoutTest, SaveLoadRoundTrip) {
  LoraConfig lora;
  lora.expert_layout = GetParam();
  LoraAdapter adapter = *LoraAdapter::Create(SmallConfig(), lora, 3);
  const std::string path = TempPath("adapter.safetensors");
  ASSERT_TRUE(adapter.Save(path).ok());
  auto loaded = LoraAdapter::Load(path, SmallConfig());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->config().ToJson(), adapter.config().ToJson());
  for (const std::string& name : adapter.parameters().names()) {
    EXPECT_EQ(loaded->parameters().Find(name)->value, adapter.parameters().Find(name)->value);
  }
}

INSTANTIATE_TEST_SUITE_P(AllLayouts, AdapterLayoutTest,
                         ::testing::Values(ExpertLayout::kPerExpert, ExpertLayout::kShared,
                                           ExpertLayout::kSharedOuter));

TEST(AdapterTest, NamesFollowTheLayout) {
  LoraConfig lora;
  lora.expert_layout = ExpertLayout::kSharedOuter;
  const SafetensorsFile file = LoraAdapter::Create(SmallConfig(), lora, 3)->ToSafetensors();
  // gate/up share A and keep B per expert; down keeps A per expert and shares B.
  EXPECT_TRUE(file.tensors.contains("model.layers.1.mlp.experts.gate_proj.lora_A.weight"));
  EXPECT_TRUE(file.tensors.contains("model.layers.1.mlp.experts.2.gate_proj.lora_B.weight"));
  EXPECT_TRUE(file.tensors.contains("model.layers.1.mlp.experts.2.down_proj.lora_A.weight"));
  EXPECT_TRUE(file.tensors.contains("model.layers.1.mlp.experts.down_proj.lora_B.weight"));
  EXPECT_TRUE(file.tensors.contains("model.layers.0.self_attn.q_proj.lora_A.weight"));
  EXPECT_TRUE(file.metadata.contains("tandem.lora_config"));
}

TEST(AdapterTest, AdapterForAnotherModelIsRefused) {
  LoraAdapter adapter = *LoraAdapter::Create(SmallConfig(), LoraConfig{}, 3);
  ASSERT_TRUE(adapter.Save(TempPath("other.safetensors")).ok());
  ModelConfig other = SmallConfig();
  other.num_experts = 8;
  EXPECT_EQ(LoraAdapter::Load(TempPath("other.safetensors"), other).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ConfigTest, BadValuesAreRejectedByName) {
  ModelConfig config = SmallConfig();
  config.top_k = 5;
  EXPECT_THAT(config.Validate().message(), HasSubstr("top_k = 5 is outside [1, 4]"));
  EXPECT_THAT(ModelConfig::FromJson(R"({"vocab_size": 10, "scoring": "relu"})").status().message(),
              HasSubstr("scoring = 'relu'"));
  EXPECT_THAT(ModelConfig::FromJson("[1]").status().message(), HasSubstr("not a JSON object"));
  EXPECT_THAT(LoraConfig::FromJson(R"({"targets": ["lm_head"]})").status().message(),
              HasSubstr("lora target 'lm_head'"));
  EXPECT_THAT(LoraConfig::FromJson(R"({"expert_layout": "diagonal"})").status().message(),
              HasSubstr("expert_layout = 'diagonal'"));
  EXPECT_THAT(LoraConfig::FromJson(R"({"rank": "eight"})").status().message(),
              HasSubstr("config field 'rank'"));
}

TEST(ConfigTest, JsonRoundTrip) {
  ModelConfig config = SmallConfig();
  config.scoring = kernels::ScoringFunction::kSigmoid;
  config.num_shared_experts = 1;
  auto parsed = ModelConfig::FromJson(config.ToJson());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->ToJson(), config.ToJson());
}

}  // namespace
}  // namespace tandem::engine
