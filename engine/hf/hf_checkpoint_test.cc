#include "engine/hf/hf_checkpoint.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "engine/hf/hf_architecture.h"
#include "engine/hf/testing/checkpoint_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::engine::hf {
namespace {

using ::testing::HasSubstr;

// A tiny Qwen3-MoE: layer 0 dense (mlp_only_layers), layer 1 MoE; head_dim 8 is not
// hidden_size / heads, and K/V have half the heads.
nlohmann::json TinyConfig() {
  return {{"architectures", {"Qwen3MoeForCausalLM"}},
          {"model_type", "qwen3_moe"},
          {"vocab_size", 32},
          {"hidden_size", 16},
          {"intermediate_size", 24},
          {"moe_intermediate_size", 8},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"head_dim", 8},
          {"num_experts", 4},
          {"num_experts_per_tok", 2},
          {"mlp_only_layers", {0}},
          {"norm_topk_prob", true},
          {"max_position_embeddings", 64},
          {"hidden_act", "silu"},
          {"rope_scaling", nullptr},
          {"torch_dtype", "bfloat16"}};
}

std::string Directory(const std::string& name) {
  const std::filesystem::path path = std::filesystem::path(std::getenv("TEST_TMPDIR")) / name;
  std::filesystem::remove_all(path);
  std::filesystem::create_directories(path);
  return path.string();
}

// Element i of every tensor is i / 8 (exact in BF16 for the sizes here).
Tensor Filled(DType dtype, const std::vector<int64_t>& shape) {
  Tensor tensor = *Tensor::Create(dtype, shape);
  for (int64_t i = 0; i < tensor.num_elements(); ++i) {
    const float value = static_cast<float>(i % 256) / 8.0f;
    if (dtype == DType::kF32) (*tensor.mutable_data<float>())[i] = value;
    if (dtype == DType::kBF16) (*tensor.mutable_data<BFloat16>())[i] = ToBFloat16(value);
  }
  return tensor;
}

void WriteJson(const std::string& path, const nlohmann::json& json) {
  std::ofstream(path) << json.dump(2);
}

// Writes the tiny model into `directory`, in two BF16 shards with an index when `sharded`,
// else in one F32 model.safetensors. `edit` may change the tensors first.
void WriteTiny(const std::string& directory, bool sharded,
               const std::function<void(std::map<std::string, Tensor>&)>& edit = nullptr) {
  std::map<std::string, Tensor> tensors;
  for (const auto& [name, shape] : HfTensorShapes(*HfArchitectureFromConfig(TinyConfig()))) {
    tensors[name] = Filled(sharded ? DType::kBF16 : DType::kF32, shape);
  }
  if (edit) edit(tensors);
  ASSERT_TRUE(
      testing::WriteCheckpoint(directory, TinyConfig(), std::move(tensors), sharded ? 2 : 1).ok());
}

absl::Status LoadAndCheck(const std::string& directory) {
  auto checkpoint = ReadHfCheckpoint(directory);
  if (!checkpoint.ok()) return checkpoint.status();
  auto architecture = HfArchitectureFromConfig(checkpoint->config);
  if (!architecture.ok()) return architecture.status();
  return CheckTensorShapes(*checkpoint, HfTensorShapes(*architecture));
}

TEST(HfCheckpointTest, AShardedBf16CheckpointLoadsAsF32) {
  const std::string directory = Directory("sharded");
  WriteTiny(directory, /*sharded=*/true);
  auto checkpoint = ReadHfCheckpoint(directory);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  const Tensor& norm = checkpoint->tensors.at("model.layers.1.self_attn.k_norm.weight");
  EXPECT_EQ(norm.dtype(), DType::kF32);
  EXPECT_EQ((*norm.data<float>())[3], 3.0f / 8.0f);
  auto config = HfArchitectureFromConfig(checkpoint->config);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(CheckTensorShapes(*checkpoint, HfTensorShapes(*config)).ok());
  EXPECT_TRUE(checkpoint->tensors.contains("model.layers.1.mlp.experts.3.down_proj.weight"));
  EXPECT_TRUE(checkpoint->tensors.contains("model.layers.0.mlp.down_proj.weight"));
}

TEST(HfCheckpointTest, ASingleF32FileLoads) {
  const std::string directory = Directory("single");
  WriteTiny(directory, /*sharded=*/false);
  EXPECT_TRUE(LoadAndCheck(directory).ok());
}

TEST(HfCheckpointTest, AMissingTensorIsNamed) {
  const std::string directory = Directory("missing");
  WriteTiny(directory, true,
            [](auto& tensors) { tensors.erase("model.layers.1.mlp.experts.2.up_proj.weight"); });
  const absl::Status status = LoadAndCheck(directory);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("lacks tensor model.layers.1.mlp.experts.2.up_proj.weight"));
}

TEST(HfCheckpointTest, AWrongShapeIsNamedWithBothShapes) {
  const std::string directory = Directory("shape");
  WriteTiny(directory, true, [](auto& tensors) {
    tensors["model.layers.0.self_attn.k_proj.weight"] = Filled(DType::kBF16, {32, 16});
  });
  const absl::Status status = LoadAndCheck(directory);
  EXPECT_THAT(status.message(),
              HasSubstr("tensor model.layers.0.self_attn.k_proj.weight has shape [32,16]; the "
                        "config makes it [16,16]"));
}

TEST(HfCheckpointTest, AnUnexpectedTensorIsNamed) {
  const std::string directory = Directory("extra");
  WriteTiny(directory, false, [](auto& tensors) {
    tensors["model.layers.0.self_attn.q_proj.bias"] = Filled(DType::kF32, {32});
  });
  EXPECT_THAT(LoadAndCheck(directory).message(),
              HasSubstr("holds tensor model.layers.0.self_attn.q_proj.bias"));
}

TEST(HfCheckpointTest, ATruncatedShardNamesTheTensorsItShouldHold) {
  const std::string directory = Directory("truncated");
  WriteTiny(directory, true);
  const std::string shard = directory + "/model-00002-of-00002.safetensors";
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 100);
  const absl::Status status = ReadHfCheckpoint(directory).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("model-00002-of-00002.safetensors"));
  EXPECT_THAT(status.message(), HasSubstr("it should hold model.layers."));
}

TEST(HfCheckpointTest, AnIndexNamingATensorItsShardLacksIsDataLoss) {
  const std::string directory = Directory("index");
  WriteTiny(directory, true);
  std::ifstream in(directory + "/model.safetensors.index.json");
  nlohmann::json index = nlohmann::json::parse(in);
  index["weight_map"]["model.layers.9.ghost.weight"] = "model-00001-of-00002.safetensors";
  WriteJson(directory + "/model.safetensors.index.json", index);
  const absl::Status status = ReadHfCheckpoint(directory).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("model.layers.9.ghost.weight"));
}

TEST(HfCheckpointTest, MissingFilesAreNotFound) {
  const std::string directory = Directory("empty");
  EXPECT_EQ(ReadHfCheckpoint(directory).status().code(), absl::StatusCode::kNotFound);
  WriteJson(directory + "/config.json", TinyConfig());
  EXPECT_THAT(ReadHfCheckpoint(directory).status().message(), HasSubstr("model.safetensors"));
  WriteTiny(directory, true);
  std::filesystem::remove(directory + "/model-00001-of-00002.safetensors");
  const absl::Status status = ReadHfCheckpoint(directory).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("it should hold "));
}

TEST(HfArchitectureTest, WhatIsNotComputedExactlyIsRefusedByName) {
  const std::vector<std::pair<std::string, nlohmann::json>> refused = {
      {"architectures", nlohmann::json::array({"GptOssForCausalLM"})},
      {"rope_scaling", {{"rope_type", "dynamic"}, {"factor", 4.0}}},
      {"use_sliding_window", true},
      {"attention_bias", true},
      {"hidden_act", "gelu"},
      {"hidden_size", nullptr},
      {"num_key_value_heads", 3},
      {"num_experts_per_tok", 5},
      {"mlp_only_layers", {7}},
      {"head_dim", "eight"},
  };
  for (const auto& [field, value] : refused) {
    nlohmann::json json = TinyConfig();
    json[field] = value;
    auto config = HfArchitectureFromConfig(json);
    ASSERT_FALSE(config.ok()) << field;
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(config.status().message(), HasSubstr(field)) << config.status();
  }
}

TEST(HfArchitectureTest, SparseStepAndMlpOnlyLayersPlaceTheMoeLayers) {
  nlohmann::json json = TinyConfig();
  json["num_hidden_layers"] = 6;
  json["decoder_sparse_step"] = 2;
  json["mlp_only_layers"] = {3};
  auto architecture = HfArchitectureFromConfig(json);
  ASSERT_TRUE(architecture.ok()) << architecture.status();
  std::vector<bool> moe;
  for (int layer = 0; layer < 6; ++layer) moe.push_back(architecture->config.IsMoeLayer(layer));
  EXPECT_EQ(moe, (std::vector<bool>{false, true, false, false, false, true}));
  json.erase("head_dim");
  json.erase("num_key_value_heads");
  auto defaults = HfArchitectureFromConfig(json);
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->config.head_dim(), 4);
  EXPECT_EQ(defaults->config.kv_heads(), 4);
}

}  // namespace
}  // namespace tandem::engine::hf
