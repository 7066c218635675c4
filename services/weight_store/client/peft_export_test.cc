#include "services/weight_store/client/peft_export.h"

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/safetensors.h"
#include "common/testing/test_dir.h"
#include "common/testing/test_server.h"
#include "engine/cpu_model_ops.h"
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
  engine::Transformer transformer(base, &adapter,
                                  std::make_unique<engine::CpuModelOps>(base.config()));
  const float* logits = *transformer.Forward(batch);
  return std::vector<float>(logits, logits + batch.num_tokens() * base.config().vocab_size);
}

class PeftExportTest : public ::testing::TestWithParam<engine::ExpertLayout> {
 protected:
  void SetUp() override {
    dir_ = tandem::testing::FreshTestDir("peft_export");
    auto server = testing::StartWeightStore({.data_dir = dir_ + "/store", .enable_ucx = false});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = std::make_unique<WeightStoreStubs>(server_.Channel());
  }

  void Publish(const engine::LoraAdapter& adapter, int64_t version,
               const std::string& architecture = "") {
    auto built = BuildAdapterVersion(adapter, adapter.model_config(), "policy", version,
                                     type::v1::DTYPE_BF16);
    ASSERT_TRUE(built.ok()) << built.status();
    if (!architecture.empty())
      (*built->manifest.mutable_labels())[kArchitectureLabel] = architecture;
    auto published = PublishAdapter(*stub_, built->manifest, built->shard_views(), {});
    ASSERT_TRUE(published.ok()) << published.status();
  }

  std::string dir_;
  tandem::testing::LoopbackServer server_;
  std::unique_ptr<WeightStoreStubs> stub_;
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

// A version published by three writers (a job's data-parallel ranks), each putting its own
// shard, is one version: fetched resharded into the engine's layout and exported to PEFT, it is
// the adapter that was published.
TEST_P(PeftExportTest, AVersionPublishedByManyWritersIsTheWholeAdapter) {
  const engine::ModelConfig model = QwenShapedModel();
  engine::BaseModel base = *engine::BaseModel::Create(model, 3);
  engine::LoraAdapter adapter = RandomAdapter(model, GetParam());
  auto built = BuildAdapterVersion(adapter, model, "policy", 1, type::v1::DTYPE_F32, /*writers=*/3);
  ASSERT_TRUE(built.ok()) << built.status();
  ASSERT_EQ(built->manifest.shards_size(), 3);
  auto begun = BeginUpload(*stub_, built->manifest, /*use_ucx=*/false);
  ASSERT_TRUE(begun.ok()) << begun.status();
  std::vector<std::thread> writers;
  for (int writer = 0; writer < 3; ++writer) {
    writers.emplace_back([&, writer] {
      EXPECT_TRUE(PutShards(*stub_, *begun, built->shard_views(), {&writer, 1}, {}).ok());
    });
  }
  for (std::thread& writer : writers) writer.join();
  ASSERT_TRUE(CommitUpload(*stub_, begun->upload_id(), {}).ok());

  auto fetched = FetchAdapter(*stub_, "policy", 1, {.target = EngineTargetLayout()});
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  auto rebuilt = AdapterFromFetched(model, built->manifest.lora(), *fetched);
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
  for (const std::string& name : adapter.parameters().names()) {
    EXPECT_EQ(rebuilt->parameters().Find(name)->value, adapter.parameters().Find(name)->value)
        << name;
  }
  ASSERT_TRUE(ExportPeftAdapter(*stub_, "policy", 1, dir_ + "/peft", "base").ok());
  auto imported = engine::ReadPeftAdapter(dir_ + "/peft", model);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_THAT(Logits(base, *imported), Pointwise(FloatNear(1e-5f), Logits(base, adapter)));
}

// A writer that never puts its shard leaves the version uncommitted, never torn.
TEST_P(PeftExportTest, AVersionMissingAWritersShardIsNeverCommitted) {
  const engine::ModelConfig model = QwenShapedModel();
  auto built = BuildAdapterVersion(RandomAdapter(model, GetParam()), model, "policy", 1,
                                   type::v1::DTYPE_F32, /*writers=*/2);
  ASSERT_TRUE(built.ok()) << built.status();
  auto begun = BeginUpload(*stub_, built->manifest, /*use_ucx=*/false);
  ASSERT_TRUE(begun.ok()) << begun.status();
  const int first = 0;
  ASSERT_TRUE(PutShards(*stub_, *begun, built->shard_views(), {&first, 1}, {}).ok());
  const absl::Status committed = CommitUpload(*stub_, begun->upload_id(), {}).status();
  EXPECT_EQ(committed.code(), absl::StatusCode::kFailedPrecondition) << committed;
  EXPECT_THAT(committed.message(), ::testing::HasSubstr("shard 1"));
  AbortUpload(*stub_, begun->upload_id());
  EXPECT_EQ(FetchAdapter(*stub_, "policy", 1, {.target = EngineTargetLayout()}).status().code(),
            absl::StatusCode::kNotFound);
  // As many writers as tensors, whatever their sizes: one tensor each.
  auto one_each = BuildAdapterVersion(RandomAdapter(model, GetParam()), model, "policy", 2,
                                      type::v1::DTYPE_F32, built->manifest.tensors_size());
  ASSERT_TRUE(one_each.ok()) << one_each.status();
  for (const weightstore::v1::Shard& shard : one_each->manifest.shards()) {
    EXPECT_EQ(shard.pieces_size(), 1) << shard.DebugString();
  }
  EXPECT_EQ(
      BuildAdapterVersion(RandomAdapter(model, GetParam()), model, "policy", 2, type::v1::DTYPE_F32,
                          /*writers=*/100000)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
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
  auto server = testing::StartWeightStore({.data_dir = dir + "/store", .enable_ucx = false});
  ASSERT_TRUE(server.ok());
  auto stub = std::make_unique<WeightStoreStubs>(server->Channel());
  const absl::Status status = ExportPeftAdapter(*stub, "nobody", 3, dir + "/out", "").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
}

}  // namespace
}  // namespace tandem::weight_store
