#include "transfer/lora_layout.h"


#include <string>
#include <vector>

#include "common/checksum.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transfer/lora_testing.h"

namespace tandem::transfer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

type::v1::LoraConfig Lora(type::v1::ExpertLayout layout) {
  type::v1::LoraConfig lora;
  lora.set_rank(3);
  lora.set_alpha(6);
  lora.set_expert_layout(layout);
  return lora;
}

std::vector<weightstore::v1::CanonicalTensor> Tensors(
    type::v1::ExpertLayout layout, type::v1::Dtype dtype = type::v1::DTYPE_BF16) {
  absl::StatusOr<std::vector<weightstore::v1::CanonicalTensor>> tensors =
      CanonicalTensorsFor(kTinyModel, Lora(layout), dtype);
  EXPECT_TRUE(tensors.ok()) << tensors.status();
  return *tensors;
}

const weightstore::v1::CanonicalTensor* Find(
    const std::vector<weightstore::v1::CanonicalTensor>& tensors, absl::string_view name) {
  for (const weightstore::v1::CanonicalTensor& tensor : tensors) {
    if (tensor.spec().name() == name) return &tensor;
  }
  return nullptr;
}

std::vector<int64_t> Shape(const weightstore::v1::CanonicalTensor& tensor) {
  return {tensor.spec().shape().begin(), tensor.spec().shape().end()};
}

TEST(CanonicalTensorsForTest, PerExpertNamesShapesAndOrder) {
  const std::vector<weightstore::v1::CanonicalTensor> tensors =
      Tensors(type::v1::EXPERT_LAYOUT_PER_EXPERT);
  // Layer 0: 4 attention + 3 dense MLP projections; layers 1-2: 4 attention + 3 expert ones.
  ASSERT_EQ(tensors.size(), 3 * 7 * 2);
  for (size_t i = 1; i < tensors.size(); ++i) {
    EXPECT_LT(tensors[i - 1].spec().name(), tensors[i].spec().name());
  }
  const weightstore::v1::CanonicalTensor* q_b =
      Find(tensors, "model.layers.0.self_attn.q_proj.lora_B.weight");
  ASSERT_NE(q_b, nullptr);
  EXPECT_THAT(Shape(*q_b), ElementsAre(8, 3));
  EXPECT_EQ(q_b->spec().dtype(), type::v1::DTYPE_BF16);
  const weightstore::v1::CanonicalTensor* o_a =
      Find(tensors, "model.layers.2.self_attn.o_proj.lora_A.weight");
  ASSERT_NE(o_a, nullptr);
  EXPECT_THAT(Shape(*o_a), ElementsAre(3, 8));
  const weightstore::v1::CanonicalTensor* dense_down =
      Find(tensors, "model.layers.0.mlp.down_proj.lora_A.weight");
  ASSERT_NE(dense_down, nullptr);
  EXPECT_THAT(Shape(*dense_down), ElementsAre(3, 12));
  const weightstore::v1::CanonicalTensor* expert_down =
      Find(tensors, "model.layers.1.mlp.experts.{e}.down_proj.lora_B.weight");
  ASSERT_NE(expert_down, nullptr);
  EXPECT_THAT(Shape(*expert_down), ElementsAre(8, 3));
  EXPECT_EQ(expert_down->num_experts(), 4);
  EXPECT_EQ(Find(tensors, "model.layers.1.mlp.experts.down_proj.lora_B.weight"), nullptr);
}

TEST(CanonicalTensorsForTest, SharedLayoutHasNoPerExpertTensors) {
  for (const weightstore::v1::CanonicalTensor& tensor : Tensors(type::v1::EXPERT_LAYOUT_SHARED)) {
    EXPECT_EQ(tensor.num_experts(), 0) << tensor.spec().name();
  }
  EXPECT_NE(Find(Tensors(type::v1::EXPERT_LAYOUT_SHARED),
                 "model.layers.2.mlp.experts.gate_proj.lora_A.weight"),
            nullptr);
}

TEST(CanonicalTensorsForTest, SharedOuterSharesTheHiddenSide) {
  const std::vector<weightstore::v1::CanonicalTensor> tensors =
      Tensors(type::v1::EXPERT_LAYOUT_SHARED_OUTER);
  for (absl::string_view name : {"model.layers.1.mlp.experts.gate_proj.lora_A.weight",
                                 "model.layers.1.mlp.experts.up_proj.lora_A.weight",
                                 "model.layers.1.mlp.experts.down_proj.lora_B.weight"}) {
    const weightstore::v1::CanonicalTensor* tensor = Find(tensors, name);
    ASSERT_NE(tensor, nullptr) << name;
    EXPECT_EQ(tensor->num_experts(), 0);
  }
  for (absl::string_view name : {"model.layers.1.mlp.experts.{e}.gate_proj.lora_B.weight",
                                 "model.layers.1.mlp.experts.{e}.up_proj.lora_B.weight",
                                 "model.layers.1.mlp.experts.{e}.down_proj.lora_A.weight"}) {
    const weightstore::v1::CanonicalTensor* tensor = Find(tensors, name);
    ASSERT_NE(tensor, nullptr) << name;
    EXPECT_EQ(tensor->num_experts(), 4);
  }
}

TEST(CanonicalTensorsForTest, TargetModulesSelectProjections) {
  type::v1::LoraConfig lora = Lora(type::v1::EXPERT_LAYOUT_PER_EXPERT);
  lora.add_target_modules("o_proj");
  lora.add_target_modules("down_proj");
  absl::StatusOr<std::vector<weightstore::v1::CanonicalTensor>> tensors =
      CanonicalTensorsFor(kTinyModel, lora, type::v1::DTYPE_F32);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  EXPECT_EQ(tensors->size(), 3 * 2 * 2);
  for (const weightstore::v1::CanonicalTensor& tensor : *tensors) {
    EXPECT_THAT(tensor.spec().name(),
                ::testing::AnyOf(HasSubstr("o_proj"), HasSubstr("down_proj")));
  }
}

TEST(CanonicalTensorsForTest, RejectsBadInput) {
  const ModelShape model = kTinyModel;
  type::v1::LoraConfig lora = Lora(type::v1::EXPERT_LAYOUT_PER_EXPERT);
  lora.set_rank(0);
  EXPECT_THAT(CanonicalTensorsFor(model, lora, type::v1::DTYPE_F32).status().message(),
              HasSubstr("lora.rank: 0"));
  lora = Lora(type::v1::EXPERT_LAYOUT_UNSPECIFIED);
  EXPECT_THAT(CanonicalTensorsFor(model, lora, type::v1::DTYPE_F32).status().message(),
              HasSubstr("lora.expert_layout"));
  lora = Lora(type::v1::EXPERT_LAYOUT_SHARED);
  lora.add_target_modules("router");
  EXPECT_THAT(CanonicalTensorsFor(model, lora, type::v1::DTYPE_F32).status().message(),
              HasSubstr("'router'"));
  lora = Lora(type::v1::EXPERT_LAYOUT_SHARED);
  lora.add_target_modules("q_proj");
  lora.add_target_modules("q_proj");
  EXPECT_THAT(CanonicalTensorsFor(model, lora, type::v1::DTYPE_F32).status().message(),
              HasSubstr("duplicate 'q_proj'"));
  lora = Lora(type::v1::EXPERT_LAYOUT_SHARED);
  EXPECT_EQ(CanonicalTensorsFor(model, lora, type::v1::DTYPE_UNSPECIFIED).status().code(),
            absl::StatusCode::kInvalidArgument);
  ModelShape no_experts = model;
  no_experts.num_experts = 0;
  EXPECT_THAT(CanonicalTensorsFor(no_experts, lora, type::v1::DTYPE_F32).status().message(),
              HasSubstr("num_experts 0"));
}

TEST(TpSplitDimTest, FollowsColumnAndRowParallelRules) {
  auto split = [](absl::string_view name) {
    type::v1::TensorSpec spec;
    spec.set_name(std::string(name));
    spec.add_shape(4);
    spec.add_shape(4);
    return TpSplitDim(spec);
  };
  EXPECT_EQ(split("model.layers.0.self_attn.q_proj.lora_A.weight"), -1);
  EXPECT_EQ(split("model.layers.0.self_attn.q_proj.lora_B.weight"), 0);
  EXPECT_EQ(split("model.layers.0.self_attn.o_proj.lora_A.weight"), 1);
  EXPECT_EQ(split("model.layers.0.self_attn.o_proj.lora_B.weight"), -1);
  EXPECT_EQ(split("model.layers.1.mlp.experts.{e}.up_proj.lora_B.weight"), 0);
  EXPECT_EQ(split("model.layers.1.mlp.experts.down_proj.lora_A.weight"), 1);
  EXPECT_EQ(split("model.embed_tokens.weight"), -1);
}

TEST(BuildProducerShardTest, CutsTpSplitTensorsAndLocalExperts) {
  const std::vector<weightstore::v1::CanonicalTensor> tensors =
      Tensors(type::v1::EXPERT_LAYOUT_PER_EXPERT);
  const auto canonical = RandomCanonicalBytes(tensors, 7);
  const ProducerLayout layout{.tp_rank = 1, .tp_size = 2, .ep_rank = 1, .ep_size = 2};
  absl::StatusOr<std::pair<weightstore::v1::Shard, std::string>> shard =
      BuildProducerShard(tensors, canonical, layout, 3);
  ASSERT_TRUE(shard.ok()) << shard.status();
  const auto& [proto, bytes] = *shard;
  EXPECT_EQ(proto.producer_rank(), 3);
  EXPECT_EQ(proto.byte_size(), bytes.size());
  EXPECT_EQ(proto.xxh3_64(), Xxh3Checksum(bytes));
  // ep_rank 1 holds no attention tensors, tp_rank 1 no per-expert lora_A of gate/up (whole).
  for (const weightstore::v1::ShardPiece& piece : proto.pieces()) {
    EXPECT_THAT(piece.tensor_name(), HasSubstr(".{e}.")) << piece.tensor_name();
    EXPECT_EQ(piece.expert_begin(), 2);
    EXPECT_EQ(piece.expert_end(), 4);
  }
  // Layer 1 experts 2..3 of down_proj lora_A [3, 4], columns 2..3, stacked: [2, 3, 2].
  const std::string name = "model.layers.1.mlp.experts.{e}.down_proj.lora_A.weight";
  const weightstore::v1::ShardPiece* down = nullptr;
  for (const weightstore::v1::ShardPiece& piece : proto.pieces()) {
    if (piece.tensor_name() == name) down = &piece;
  }
  ASSERT_NE(down, nullptr);
  ASSERT_EQ(down->slice_size(), 2);
  EXPECT_EQ(down->slice(1).offset(), 2);
  EXPECT_EQ(down->slice(1).size(), 2);
  EXPECT_FALSE(down->fused_gate_up());
  std::string expected;
  for (int e = 2; e < 4; ++e) {
    for (int row = 0; row < 3; ++row) {
      expected += canonical.at(name).substr(((e * 3 + row) * 4 + 2) * 2, 2 * 2);
    }
  }
  EXPECT_EQ(bytes.substr(down->byte_offset(), down->byte_length()), expected);
}

TEST(BuildProducerShardTest, FusesGateAndUpAlongDimZero) {
  const std::vector<weightstore::v1::CanonicalTensor> tensors =
      Tensors(type::v1::EXPERT_LAYOUT_SHARED);
  const auto canonical = RandomCanonicalBytes(tensors, 7);
  const ProducerLayout layout{.tp_rank = 1, .tp_size = 2};
  absl::StatusOr<std::pair<weightstore::v1::Shard, std::string>> shard =
      BuildProducerShard(tensors, canonical, layout, 1);
  ASSERT_TRUE(shard.ok()) << shard.status();
  const std::string gate = "model.layers.0.mlp.gate_proj.lora_B.weight";  // [12, 3]
  for (const weightstore::v1::ShardPiece& piece : shard->first.pieces()) {
    EXPECT_THAT(piece.tensor_name(), ::testing::Not(HasSubstr("up_proj")));
    if (piece.tensor_name() != gate) continue;
    EXPECT_TRUE(piece.fused_gate_up());
    EXPECT_EQ(piece.fused_dim(), 0);
    // Rows 6..11 of 6-byte rows: the second half of each tensor.
    const std::string up = "model.layers.0.mlp.up_proj.lora_B.weight";
    EXPECT_EQ(shard->second.substr(piece.byte_offset(), piece.byte_length()),
              canonical.at(gate).substr(36) + canonical.at(up).substr(36));
  }
}

TEST(BuildProducerShardTest, UnstackedExpertsGetOnePieceEach) {
  const std::vector<weightstore::v1::CanonicalTensor> tensors =
      Tensors(type::v1::EXPERT_LAYOUT_PER_EXPERT);
  const ProducerLayout layout{.ep_rank = 0, .ep_size = 2, .stack_experts = false};
  absl::StatusOr<std::pair<weightstore::v1::Shard, std::string>> shard =
      BuildProducerShard(tensors, RandomCanonicalBytes(tensors, 7), layout, 0);
  ASSERT_TRUE(shard.ok()) << shard.status();
  int pieces = 0;
  for (const weightstore::v1::ShardPiece& piece : shard->first.pieces()) {
    if (piece.tensor_name() != "model.layers.2.mlp.experts.{e}.down_proj.lora_B.weight") continue;
    EXPECT_EQ(piece.expert_end(), piece.expert_begin() + 1);
    ++pieces;
  }
  EXPECT_EQ(pieces, 2);
}

TEST(BuildProducerShardTest, RankHoldingNothingGetsAnEmptyShard) {
  const std::vector<weightstore::v1::CanonicalTensor> tensors =
      Tensors(type::v1::EXPERT_LAYOUT_SHARED);
  const ProducerLayout layout{.tp_rank = 1, .tp_size = 2, .ep_rank = 1, .ep_size = 2};
  absl::StatusOr<std::pair<weightstore::v1::Shard, std::string>> shard =
      BuildProducerShard(tensors, RandomCanonicalBytes(tensors, 7), layout, 3);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(shard->first.byte_size(), 0);
  EXPECT_EQ(shard->first.pieces_size(), 0);
}

TEST(BuildProducerShardTest, RejectsBadInput) {
  const std::vector<weightstore::v1::CanonicalTensor> tensors =
      Tensors(type::v1::EXPERT_LAYOUT_PER_EXPERT);
  auto canonical = RandomCanonicalBytes(tensors, 7);
  EXPECT_THAT(
      BuildProducerShard(tensors, canonical, {.tp_rank = 2, .tp_size = 2}, 0).status().message(),
      HasSubstr("tp_rank 2"));
  EXPECT_THAT(BuildProducerShard(tensors, canonical, {.ep_rank = -1}, 0).status().message(),
              HasSubstr("ep_rank -1"));
  EXPECT_THAT(BuildProducerShard(tensors, canonical, {}, -1).status().message(),
              HasSubstr("producer_rank -1"));
  EXPECT_THAT(BuildProducerShard(tensors, canonical, {.tp_size = 3}, 0).status().message(),
              HasSubstr("not divisible by 3"));
  EXPECT_THAT(BuildProducerShard(tensors, canonical, {.ep_size = 3}, 0).status().message(),
              HasSubstr("not divisible by 3"));
  canonical["model.layers.0.self_attn.q_proj.lora_A.weight"].pop_back();
  EXPECT_THAT(BuildProducerShard(tensors, canonical, {}, 0).status().message(),
              HasSubstr("q_proj.lora_A.weight': expected 48 bytes, got 47"));
  canonical.erase("model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_THAT(BuildProducerShard(tensors, canonical, {}, 0).status().message(),
              HasSubstr("got none"));
}

}  // namespace
}  // namespace tandem::transfer
