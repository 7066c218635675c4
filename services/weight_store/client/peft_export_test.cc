#include "services/weight_store/client/peft_export.h"

#include <random>

#include "common/safetensors.h"
#include "common/testing/test_dir.h"
#include "common/testing/test_server.h"
#include "engine/module_names.h"
#include "engine/peft_adapter.h"
#include "engine/transformer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/weight_store/client/adapter_client.h"
#include "services/weight_store/client/engine_lora.h"
#include "services/weight_store/client/testing/weight_store_server.h"

namespace tandem::weight_store {
namespace {

using ::testing::FloatNear;
using ::testing::Pointwise;

// Qwen3-MoE's shapes in small: grouped-query attention with its own head size, q/k norms, a
// dense layer between MoE layers.
engine::ModelConfig QwenShapedModel() {
  engine::ModelConfig config;
  config.vocab_size = 40;
  config.d_model = 16;
  config.num_heads = 4;
  config.num_kv_heads = 2;
  config.attention_head_dim = 6;
  config.qk_norm = engine::QkNorm::kPerHead;
  config.num_layers = 3;
  config.num_dense_layers = 0;
  config.mlp_only_layers = {1};
  config.num_experts = 4;
  config.top_k = 2;
  config.expert_ffn_dim = 8;
  config.dense_ffn_dim = 12;
  config.norm_topk_prob = false;
  config.max_seq_len = 16;
  return config;
}

engine::LoraAdapter RandomAdapter(const engine::ModelConfig& model, engine::ExpertLayout layout) {
  engine::LoraConfig lora{.rank = 3, .alpha = 6, .expert_layout = layout};
  engine::LoraAdapter adapter = *engine::LoraAdapter::Create(model, lora, 1);
  std::mt19937_64 rng(2);
  for (const std::string& name : adapter.parameters().names()) {
    engine::ParameterSet::FillNormal(*adapter.parameters().Find(name), 0.3f, rng);
  }
  return adapter;
}

std::vector<float> Logits(engine::BaseModel& base, engine::LoraAdapter& adapter) {
  engine::TokenBatch batch;
  batch.Add({1, 7, 30, 2, 11, 5, 39});
  engine::Transformer transformer(base, &adapter);
  const float* logits = *transformer.Forward(batch);
  return std::vector<float>(logits, logits + batch.num_tokens() * base.config().vocab_size);
}

class PeftExportTest : public ::testing::TestWithParam<engine::ExpertLayout> {
 protected:
  void SetUp() override {
    dir_ = tandem::testing::FreshTestDir("peft_export");
    auto service =
        testing::NewWeightStoreService({.data_dir = dir_ + "/store", .enable_ucx = false});
    ASSERT_TRUE(service.ok()) << service.status();
    auto server = tandem::testing::StartLoopbackServer(
        "weight-store", {"tandem.v1.WeightStoreService", *std::move(service)});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = v1::WeightStoreService::NewStub(server_.Channel());
  }

  void Publish(const engine::LoraAdapter& adapter, int64_t version,
               const std::string& architecture = "") {
    auto built =
        BuildAdapterVersion(adapter, adapter.model_config(), "policy", version, v1::DTYPE_BF16);
    ASSERT_TRUE(built.ok()) << built.status();
    if (!architecture.empty())
      (*built->manifest.mutable_labels())[kArchitectureLabel] = architecture;
    auto published = PublishAdapter(*stub_, built->manifest, built->shard_views(), {});
    ASSERT_TRUE(published.ok()) << published.status();
  }

  std::string dir_;
  tandem::testing::LoopbackServer server_;
  std::unique_ptr<v1::WeightStoreService::Stub> stub_;
};

// Export, then import: the adapter PEFT reads back computes what the published one computes.
TEST_P(PeftExportTest, AnExportedVersionImportsToTheSameForward) {
  const engine::ModelConfig model = QwenShapedModel();
  engine::BaseModel base = *engine::BaseModel::Create(model, 3);
  engine::LoraAdapter adapter = RandomAdapter(model, GetParam());
  Publish(adapter, 1);
  Publish(RandomAdapter(model, GetParam()), 2);

  auto exported = ExportPeftAdapter(*stub_, "policy", 1, dir_ + "/peft", "Qwen/Qwen3-30B-A3B");
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(*exported, 1);
  auto imported = engine::ReadPeftAdapter(dir_ + "/peft", model);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->config().expert_layout, engine::ExpertLayout::kPerExpert);
  // The store held BF16: compare with the adapter as it was published. PEFT has per-expert
  // tensors only, so a shared layout comes back as copies: equal in value, computed by other
  // GEMM calls, whose rounding may differ by an ulp (OpenBLAS kernels are not row-invariant).
  engine::LoraAdapter published = adapter.RoundedToBf16();
  EXPECT_THAT(Logits(base, *imported), Pointwise(FloatNear(1e-5f), Logits(base, published)));

  EXPECT_EQ(*ExportPeftAdapter(*stub_, "policy", 0, dir_ + "/newest", "base"), 2);
}

// The trainer labels versions of a Mixtral base model so; PEFT then matches Mixtral's modules.
TEST_P(PeftExportTest, AMixtralVersionIsExportedUnderMixtralNames) {
  const engine::ModelConfig model = QwenShapedModel();
  engine::BaseModel base = *engine::BaseModel::Create(model, 3);
  engine::LoraAdapter adapter = RandomAdapter(model, GetParam());
  Publish(adapter, 1, "MixtralForCausalLM");

  ASSERT_TRUE(ExportPeftAdapter(*stub_, "policy", 1, dir_ + "/peft", "mixtral").ok());
  auto file = ReadSafetensors(dir_ + "/peft/adapter_model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->tensors.contains(
      "base_model.model.model.layers.0.block_sparse_moe.experts.3.w2.lora_B.weight"));
  auto imported = engine::ReadPeftAdapter(dir_ + "/peft", model, engine::MixtralModuleNames());
  ASSERT_TRUE(imported.ok()) << imported.status();
  engine::LoraAdapter published = adapter.RoundedToBf16();
  EXPECT_THAT(Logits(base, *imported), Pointwise(FloatNear(1e-5f), Logits(base, published)));
}

INSTANTIATE_TEST_SUITE_P(AllLayouts, PeftExportTest,
                         ::testing::Values(engine::ExpertLayout::kPerExpert,
                                           engine::ExpertLayout::kShared,
                                           engine::ExpertLayout::kSharedOuter));

TEST(PeftExportErrorsTest, AnUnknownVersionIsNotFound) {
  const std::string dir = tandem::testing::FreshTestDir("peft_export_errors");
  auto service = testing::NewWeightStoreService({.data_dir = dir + "/store", .enable_ucx = false});
  ASSERT_TRUE(service.ok());
  auto server = tandem::testing::StartLoopbackServer(
      "weight-store", {"tandem.v1.WeightStoreService", *std::move(service)});
  ASSERT_TRUE(server.ok());
  auto stub = v1::WeightStoreService::NewStub(server->Channel());
  const absl::Status status = ExportPeftAdapter(*stub, "nobody", 3, dir + "/out", "").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
}

}  // namespace
}  // namespace tandem::weight_store
