#include "services/weight_store/client/engine_lora.h"

#include <random>

#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/weight_store/manifest.h"
#include "services/weight_store/reshard.h"

namespace tandem::weight_store {
namespace {

using ::testing::HasSubstr;

engine::LoraAdapter RandomAdapter(const engine::ModelConfig& model, engine::ExpertLayout layout) {
  engine::LoraConfig lora;
  lora.rank = 4;
  lora.expert_layout = layout;
  engine::LoraAdapter adapter = *engine::LoraAdapter::Create(model, lora, 1);
  std::mt19937_64 rng(2);
  for (const std::string& name : adapter.parameters().names()) {
    engine::ParameterSet::FillNormal(*adapter.parameters().Find(name), 0.5f, rng);
  }
  return adapter;
}

// What a rollout replica receives for `version`: planned and assembled in the engine layout by
// the weight-store's own resharding code.
FetchedAdapter FetchInEngineLayout(const AdapterVersion& version) {
  auto plan = PlanReads(version.manifest, EngineTargetLayout(), {});
  EXPECT_TRUE(plan.ok()) << plan.status();
  FetchedAdapter fetched;
  for (const internal::v1::PlannedTensor& planned : *plan) {
    FetchedTensor tensor;
    *tensor.tensor.mutable_spec() = planned.tensor().spec();
    tensor.bytes.resize(planned.tensor().byte_size());
    ExecuteOps(planned, version.shard_views(), tensor.bytes.data());
    fetched.tensors.push_back(std::move(tensor));
  }
  return fetched;
}

class EngineLoraTest : public ::testing::TestWithParam<engine::ExpertLayout> {};

TEST_P(EngineLoraTest, PublishedVersionRebuildsTheSameAdapter) {
  const engine::ModelConfig model = engine::DefaultModelConfig();
  const engine::LoraAdapter adapter = RandomAdapter(model, GetParam());
  auto version = BuildAdapterVersion(adapter, model, "policy", 3);
  ASSERT_TRUE(version.ok()) << version.status();
  ASSERT_TRUE(ValidateManifest(version->manifest).ok()) << ValidateManifest(version->manifest);
  EXPECT_EQ(version->manifest.version(), 3);

  auto rebuilt = AdapterFromFetched(model, version->manifest.lora(), FetchInEngineLayout(*version));
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
  EXPECT_EQ(rebuilt->config().ToJson(), adapter.config().ToJson());
  for (const std::string& name : adapter.parameters().names()) {
    EXPECT_EQ(rebuilt->parameters().Find(name)->value, adapter.parameters().Find(name)->value)
        << name;
  }
}

// Group rank `rank`'s share of `adapter` under `placements`: each MoE layer's experts of that
// rank, as moving them there (placement::MoveExperts) leaves them.
engine::LoraAdapter ShardOf(const engine::LoraAdapter& adapter,
                            const placement::LayerPlacements& placements, int rank) {
  engine::LoraAdapter shard = *adapter.ExpertShard(placements.layers[0].experts[rank]);
  for (const std::string& name : shard.parameters().names()) {
    engine::Parameter& part = *shard.parameters().Find(name);
    if (!part.stacked_experts) continue;
    const engine::Parameter& whole = *adapter.parameters().Find(name);
    part.experts = placements.layers[part.moe_layer].experts[rank];
    part.value = whole.SelectExperts(whole.value, part.experts);
  }
  return shard;
}

// Four writers of a 2 x 2 expert-parallel job, each holding its group rank's experts, publish
// one version: the manifest (any writer's, with the checksums gathered) and their shards rebuild
// the adapter a rank holding everything has -- with the experts contiguous, scattered, and each
// MoE layer placed its own way.
TEST_P(EngineLoraTest, ExpertParallelWritersPublishTheWholeAdapter) {
  const engine::ModelConfig model = engine::DefaultModelConfig();  // 8 experts.
  const engine::LoraAdapter adapter = RandomAdapter(model, GetParam());
  constexpr int kCopies = 2;
  const int layers = model.num_moe_layers();
  ASSERT_GE(layers, 2);
  const placement::ExpertPlacement contiguous = placement::ExpertPlacement::Contiguous(8, 2);
  const placement::ExpertPlacement scattered{{{7, 2, 4, 1}, {0, 6, 3, 5}}};
  placement::LayerPlacements alternating;
  for (int layer = 0; layer < layers; ++layer) {
    alternating.layers.push_back(layer % 2 == 0 ? contiguous : scattered);
  }
  for (const placement::LayerPlacements& placements :
       {placement::LayerPlacements::Uniform(contiguous, layers),
        placement::LayerPlacements::Uniform(scattered, layers), alternating}) {
    SCOPED_TRACE(absl::StrJoin(placements.layers.back().experts[0], ","));
    const int writers = kCopies * placements.ranks();
    AdapterVersion whole;
    for (int writer = 0; writer < writers; ++writer) {
      const engine::LoraAdapter shard = ShardOf(adapter, placements, writer % placements.ranks());
      auto version =
          BuildExpertParallelVersion(shard, model, "policy", 2, placements, kCopies, writer);
      ASSERT_TRUE(version.ok()) << version.status();
      ASSERT_EQ(version->shards.size(), writers);
      if (writer == 0) whole = *version;
      whole.shards[writer] = version->shards[writer];
      whole.manifest.mutable_shards(writer)->set_xxh3_64(
          version->manifest.shards(writer).xxh3_64());
      for (int other = 0; other < writers; ++other) {
        EXPECT_EQ(version->shards[other].empty(), other != writer);
      }
    }
    ASSERT_TRUE(ValidateManifest(whole.manifest).ok()) << ValidateManifest(whole.manifest);
    auto rebuilt = AdapterFromFetched(model, whole.manifest.lora(), FetchInEngineLayout(whole));
    ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
    for (const std::string& name : adapter.parameters().names()) {
      EXPECT_EQ(rebuilt->parameters().Find(name)->value, adapter.parameters().Find(name)->value)
          << name;
    }
  }
  const placement::LayerPlacements one_rank =
      placement::LayerPlacements::Uniform(placement::ExpertPlacement::Contiguous(8, 1), layers);
  EXPECT_EQ(BuildExpertParallelVersion(adapter, model, "policy", 2, one_rank, 3, 0).status().code(),
            absl::StatusCode::kInvalidArgument)
      << "8 experts among 3 writers";
  const engine::LoraAdapter half = *adapter.ExpertShard(0, 4);
  if (GetParam() != engine::ExpertLayout::kShared) {  // Else nothing per expert is published.
    EXPECT_EQ(
        BuildExpertParallelVersion(half, model, "policy", 2,
                                   placement::LayerPlacements::Uniform(contiguous, layers), 1, 1)
            .status()
            .code(),
        absl::StatusCode::kInvalidArgument)
        << "writer 1 publishes experts 4..7, which it does not hold";
  }
  EXPECT_EQ(BuildExpertParallelVersion(half, model, "policy", 2,
                                       placement::LayerPlacements::Uniform(contiguous, 1), 1, 0)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument)
      << "placements of one MoE layer for a model of " << layers;
}

INSTANTIATE_TEST_SUITE_P(AllLayouts, EngineLoraTest,
                         ::testing::Values(engine::ExpertLayout::kPerExpert,
                                           engine::ExpertLayout::kShared,
                                           engine::ExpertLayout::kSharedOuter));

TEST(EngineLoraTest, Bf16VersionsRoundToNearestEven) {
  const engine::ModelConfig model = engine::DefaultModelConfig();
  const engine::LoraAdapter adapter = RandomAdapter(model, engine::ExpertLayout::kPerExpert);
  auto version = BuildAdapterVersion(adapter, model, "policy", 1, type::v1::DTYPE_BF16);
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(version->shards[0].size() * 2,
            static_cast<size_t>(adapter.parameters().num_elements()) * sizeof(float));
}

TEST(EngineLoraTest, MismatchedTensorsAreRejectedByName) {
  const engine::ModelConfig model = engine::DefaultModelConfig();
  const engine::LoraAdapter adapter = RandomAdapter(model, engine::ExpertLayout::kPerExpert);
  AdapterVersion version = *BuildAdapterVersion(adapter, model, "policy", 1);
  FetchedAdapter fetched = FetchInEngineLayout(version);

  FetchedAdapter renamed = fetched;
  renamed.tensors[0].tensor.mutable_spec()->set_name("model.layers.9.bogus");
  EXPECT_THAT(AdapterFromFetched(model, version.manifest.lora(), renamed).status().message(),
              HasSubstr("unexpected tensor 'model.layers.9.bogus'"));

  FetchedAdapter truncated = fetched;
  truncated.tensors[1].bytes.resize(4);
  EXPECT_THAT(AdapterFromFetched(model, version.manifest.lora(), truncated).status().message(),
              HasSubstr("has 4 bytes"));

  FetchedAdapter missing = fetched;
  missing.tensors.pop_back();
  EXPECT_EQ(AdapterFromFetched(model, version.manifest.lora(), missing).status().code(),
            absl::StatusCode::kInvalidArgument);

  type::v1::LoraConfig bad_rank = version.manifest.lora();
  bad_rank.set_rank(0);
  EXPECT_EQ(AdapterFromFetched(model, bad_rank, fetched).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::weight_store
