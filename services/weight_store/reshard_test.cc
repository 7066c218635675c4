#include "services/weight_store/reshard.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "services/weight_store/manifest.h"
#include "transfer/lora_layout.h"
#include "transfer/lora_testing.h"

namespace tandem::weight_store {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr int kRank = 3;

// A published adapter: manifest, the bytes of its shards, and the canonical tensors' bytes.
struct Published {
  weightstore::v1::Manifest manifest;
  std::vector<std::string> shard_bytes;
  std::vector<weightstore::v1::CanonicalTensor> tensors;
  absl::flat_hash_map<std::string, std::string> canonical;

  std::vector<absl::string_view> Shards() const { return {shard_bytes.begin(), shard_bytes.end()}; }
};

// Publishes `tensors` from every rank of a producer with `layout`'s sizes; shard i of the
// manifest is producer rank i (ep-major) unless a rank held nothing.
Published Publish(std::vector<weightstore::v1::CanonicalTensor> tensors,
                  type::v1::ExpertLayout expert_layout, transfer::ProducerLayout layout) {
  Published published;
  published.tensors = std::move(tensors);
  published.canonical = transfer::RandomCanonicalBytes(published.tensors, 1234);
  weightstore::v1::Manifest& manifest = published.manifest;
  manifest.set_adapter_name("policy");
  manifest.set_version(1);
  manifest.mutable_lora()->set_rank(kRank);
  manifest.mutable_lora()->set_expert_layout(expert_layout);
  manifest.mutable_tensors()->Add(published.tensors.begin(), published.tensors.end());
  for (int rank = 0; rank < layout.tp_size * layout.ep_size; ++rank) {
    layout.tp_rank = rank % layout.tp_size;
    layout.ep_rank = rank / layout.tp_size;
    auto shard = transfer::BuildProducerShard(published.tensors, published.canonical, layout, rank);
    EXPECT_TRUE(shard.ok()) << shard.status();
    if (!shard.ok() || shard->first.byte_size() == 0) continue;
    *manifest.add_shards() = std::move(shard->first);
    published.shard_bytes.push_back(std::move(shard->second));
  }
  EXPECT_TRUE(ValidateManifest(manifest).ok()) << ValidateManifest(manifest);
  return published;
}

Published PublishModel(type::v1::ExpertLayout expert_layout, type::v1::Dtype dtype,
                       const transfer::ProducerLayout& layout) {
  type::v1::LoraConfig lora;
  lora.set_rank(kRank);
  lora.set_expert_layout(expert_layout);
  absl::StatusOr<std::vector<weightstore::v1::CanonicalTensor>> tensors =
      transfer::CanonicalTensorsFor(transfer::kTinyModel, lora, dtype);
  EXPECT_TRUE(tensors.ok()) << tensors.status();
  return Publish(*std::move(tensors), expert_layout, layout);
}

// ---------------------------------------------------------------------------------------------
// The reference: target tensors sliced element by element from the canonical bytes, following
// the TargetLayout rules directly (every canonical tensor of the test model is 2-D).

struct Expected {
  std::vector<int64_t> shape;
  int expert_begin = 0;
  int expert_end = 0;
  std::string bytes;
};

struct Range {
  int64_t begin;
  int64_t end;
};

// The part of a dimension of `size` that rank `rank` of `parts` holds.
Range Part(int64_t size, int parts, int rank) {
  return {size / parts * rank, size / parts * (rank + 1)};
}

std::string Projection(const std::string& name) {
  const std::string before_side =
      name.substr(0, name.size() - std::string(".lora_A.weight").size());
  return before_side.substr(before_side.rfind('.') + 1);
}

// Appends element [expert][row][col] of every listed expert, canonical tensor (gate then up),
// row and column, in that nesting order.
std::string Gather(const Published& published, const std::vector<std::string>& names,
                   const std::vector<int64_t>& experts, Range rows, Range cols, int64_t num_rows,
                   int64_t num_cols, int64_t element_size) {
  std::string bytes;
  for (int64_t expert : experts) {
    for (const std::string& name : names) {
      const std::string& tensor = published.canonical.at(name);
      for (int64_t row = rows.begin; row < rows.end; ++row) {
        for (int64_t col = cols.begin; col < cols.end; ++col) {
          bytes.append(tensor, ((expert * num_rows + row) * num_cols + col) * element_size,
                       element_size);
        }
      }
    }
  }
  return bytes;
}

std::map<std::string, Expected> HandSliced(const Published& published,
                                           const weightstore::v1::TargetLayout& target) {
  const bool stack =
      target.stack_experts() || target.naming() == weightstore::v1::TENSOR_NAMING_ENGINE_NATIVE;
  const int tp_size = std::max(target.tp_size(), 1);
  const int ep_size = std::max(target.ep_size(), 1);
  const int expert_tp_size = std::max(target.expert_tp_size(), 1);
  std::map<std::string, Expected> expected;
  for (const weightstore::v1::CanonicalTensor& tensor : published.tensors) {
    const std::string& name = tensor.spec().name();
    if (target.fuse_gate_up() && absl::StrContains(name, "up_proj")) continue;
    const bool fused = target.fuse_gate_up() && absl::StrContains(name, "gate_proj");
    std::vector<std::string> parts = {name};
    if (fused) parts.push_back(absl::StrReplaceAll(name, {{"gate_proj", "up_proj"}}));
    const std::string projection = Projection(name);
    const bool lora_a = absl::StrContains(name, "lora_A");
    const bool experts_group = absl::StrContains(name, ".mlp.experts.");
    const int parts_tp = experts_group ? expert_tp_size : tp_size;
    const int rank_tp = experts_group ? target.expert_tp_rank() : target.tp_rank();
    const int64_t rows = tensor.spec().shape(0), cols = tensor.spec().shape(1);
    Range row_range{0, rows}, col_range{0, cols};
    if (!lora_a && projection != "o_proj" && projection != "down_proj") {
      row_range = Part(rows, parts_tp, rank_tp);
    }
    if (lora_a && (projection == "o_proj" || projection == "down_proj")) {
      col_range = Part(cols, parts_tp, rank_tp);
    }
    const std::string out_name =
        fused ? absl::StrReplaceAll(name, {{"gate_proj", "gate_up_proj"}}) : name;
    const std::vector<int64_t> local = {(row_range.end - row_range.begin) * std::ssize(parts),
                                        col_range.end - col_range.begin};
    const int64_t element_size = transfer::ElementSize(tensor.spec().dtype());
    auto gather = [&](std::vector<int64_t> experts) {
      return Gather(published, parts, experts, row_range, col_range, rows, cols, element_size);
    };
    if (tensor.num_experts() == 0) {
      expected[out_name] = {local, 0, 0, gather({0})};
      continue;
    }
    const Range experts = Part(tensor.num_experts(), ep_size, target.ep_rank());
    if (stack) {
      std::vector<int64_t> ids;
      for (int64_t e = experts.begin; e < experts.end; ++e) ids.push_back(e);
      expected[absl::StrReplaceAll(out_name, {{".{e}", ""}})] = {
          {experts.end - experts.begin, local[0], local[1]},
          static_cast<int>(experts.begin),
          static_cast<int>(experts.end),
          gather(ids)};
    } else {
      for (int64_t e = experts.begin; e < experts.end; ++e) {
        expected[absl::StrReplaceAll(out_name, {{"{e}", absl::StrCat(e)}})] = {local, 0, 0,
                                                                               gather({e})};
      }
    }
  }
  return expected;
}

// ---------------------------------------------------------------------------------------------

// Checks the plan's own promises: ops ascending dst_offset, within the shards, and together
// writing every byte of the tensor exactly once.
void ExpectOpsCoverOnce(const internal::v1::PlannedTensor& planned, const Published& published) {
  std::vector<int> writes(planned.tensor().byte_size(), 0);
  uint64_t previous = 0;
  for (const internal::v1::CopyOp& op : planned.ops()) {
    EXPECT_GE(op.dst_offset(), previous);
    previous = op.dst_offset();
    ASSERT_GE(op.count(), 1);
    ASSERT_GE(op.length(), 1);
    const uint64_t last = op.count() - 1;
    ASSERT_LE(op.src_offset() + last * op.src_stride() + op.length(),
              published.shard_bytes.at(op.shard_index()).size());
    ASSERT_LE(op.dst_offset() + last * op.dst_stride() + op.length(), writes.size());
    for (uint64_t i = 0; i < op.count(); ++i) {
      for (uint64_t b = 0; b < op.length(); ++b)
        ++writes[op.dst_offset() + i * op.dst_stride() + b];
    }
  }
  // A plain scan: gmock's Each builds a stream per element, which made this matrix take seconds.
  const auto not_once = std::find_if(writes.begin(), writes.end(), [](int n) { return n != 1; });
  EXPECT_TRUE(not_once == writes.end())
      << planned.tensor().spec().name() << ": byte " << (not_once - writes.begin()) << " written "
      << *not_once << " times";
}

std::string Assemble(const internal::v1::PlannedTensor& planned, const Published& published) {
  std::string bytes(planned.tensor().byte_size(), '\0');
  ExecuteOps(planned, published.Shards(), bytes.data());
  return bytes;
}

void ExpectMatchesHandSlicing(const Published& published,
                              const weightstore::v1::TargetLayout& target) {
  absl::StatusOr<std::vector<internal::v1::PlannedTensor>> plan =
      PlanReads(published.manifest, target, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::map<std::string, Expected> expected = HandSliced(published, target);
  std::vector<std::string> planned_names, expected_names;
  for (const internal::v1::PlannedTensor& planned : *plan)
    planned_names.push_back(planned.tensor().spec().name());
  for (const auto& [name, tensor] : expected) expected_names.push_back(name);
  ASSERT_THAT(planned_names, ElementsAreArray(expected_names));  // also: byte-wise name order
  for (const internal::v1::PlannedTensor& planned : *plan) {
    const weightstore::v1::TargetTensor& tensor = planned.tensor();
    const Expected& want = expected.at(tensor.spec().name());
    SCOPED_TRACE(tensor.spec().name());
    EXPECT_THAT(tensor.spec().shape(), ElementsAreArray(want.shape));
    EXPECT_EQ(tensor.expert_begin(), want.expert_begin);
    EXPECT_EQ(tensor.expert_end(), want.expert_end);
    EXPECT_EQ(tensor.byte_size(), want.bytes.size());
    EXPECT_EQ(tensor.xxh3_64(), 0);
    ExpectOpsCoverOnce(planned, published);
    EXPECT_TRUE(Assemble(planned, published) == want.bytes);
  }
}

struct Options {
  weightstore::v1::TensorNaming naming;
  bool fuse_gate_up;
  bool stack_experts;
};

using MatrixParam = std::tuple<transfer::ProducerLayout, type::v1::ExpertLayout, type::v1::Dtype>;

std::string ProducerName(const transfer::ProducerLayout& layout) {
  return absl::StrCat("Tp", layout.tp_size, "Ep", layout.ep_size,
                      layout.fuse_gate_up ? "Fused" : "", layout.stack_experts ? "Stacked" : "");
}

}  // namespace

// Readable test parameters (gtest would print the struct's bytes).
void PrintTo(const transfer::ProducerLayout& layout, std::ostream* os) {
  *os << ProducerName(layout);
}

namespace {

class ReshardMatrixTest : public ::testing::TestWithParam<MatrixParam> {};

// Every rank of every consumer layout assembles exactly what slicing by hand gives.
TEST_P(ReshardMatrixTest, AssembledTensorsMatchHandSlicing) {
  const auto& [producer, expert_layout, dtype] = GetParam();
  const Published published = PublishModel(expert_layout, dtype, producer);
  for (int tp : {1, 2, 4}) {
    for (int ep : {1, 2, 4}) {
      for (int expert_tp : tp == 1 ? std::vector<int>{1} : std::vector<int>{1, tp}) {
        for (const Options& options :
             {Options{weightstore::v1::TENSOR_NAMING_UNSPECIFIED, false, false},
              Options{weightstore::v1::TENSOR_NAMING_CANONICAL, true, true},
              Options{weightstore::v1::TENSOR_NAMING_ENGINE_NATIVE, true, false}}) {
          for (int rank = 0; rank < tp * ep * expert_tp; ++rank) {
            weightstore::v1::TargetLayout target;
            target.set_tp_size(tp);
            target.set_tp_rank(rank % tp);
            target.set_ep_size(ep);
            target.set_ep_rank(rank / tp % ep);
            target.set_expert_tp_size(expert_tp);
            target.set_expert_tp_rank(rank / tp / ep);
            target.set_naming(options.naming);
            target.set_fuse_gate_up(options.fuse_gate_up);
            target.set_stack_experts(options.stack_experts);
            SCOPED_TRACE(target.ShortDebugString());
            ExpectMatchesHandSlicing(published, target);
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Producers, ReshardMatrixTest,
    ::testing::Combine(
        ::testing::Values(transfer::ProducerLayout{.tp_size = 2, .ep_size = 2},
                          transfer::ProducerLayout{.fuse_gate_up = false, .stack_experts = false},
                          transfer::ProducerLayout{
                              .tp_size = 4, .ep_size = 1, .stack_experts = false}),
        ::testing::Values(type::v1::EXPERT_LAYOUT_PER_EXPERT, type::v1::EXPERT_LAYOUT_SHARED,
                          type::v1::EXPERT_LAYOUT_SHARED_OUTER),
        ::testing::Values(type::v1::DTYPE_BF16, type::v1::DTYPE_F32)),
    [](const auto& info) {
      return absl::StrCat(ProducerName(std::get<0>(info.param)),
                          type::v1::ExpertLayout_Name(std::get<1>(info.param)),
                          type::v1::Dtype_Name(std::get<2>(info.param)));
    });

// A consumer laid out like a producer rank gets that rank's pieces back, each with one op.
TEST(ReshardTest, ProducerLayoutRoundTrips) {
  const transfer::ProducerLayout trainer{.tp_size = 2, .ep_size = 2};
  const Published published =
      PublishModel(type::v1::EXPERT_LAYOUT_SHARED_OUTER, type::v1::DTYPE_BF16, trainer);
  ASSERT_EQ(published.manifest.shards_size(), 4);
  for (int s = 0; s < 4; ++s) {
    weightstore::v1::TargetLayout target;
    target.set_tp_rank(s % 2);
    target.set_tp_size(2);
    target.set_expert_tp_rank(s % 2);
    target.set_expert_tp_size(2);
    target.set_ep_rank(s / 2);
    target.set_ep_size(2);
    target.set_fuse_gate_up(true);
    target.set_stack_experts(true);
    absl::StatusOr<std::vector<internal::v1::PlannedTensor>> plan =
        PlanReads(published.manifest, target, {});
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::map<std::string, const internal::v1::PlannedTensor*> by_name;
    for (const internal::v1::PlannedTensor& planned : *plan)
      by_name[planned.tensor().spec().name()] = &planned;
    for (const weightstore::v1::ShardPiece& piece : published.manifest.shards(s).pieces()) {
      std::string name = absl::StrReplaceAll(piece.tensor_name(), {{".{e}", ""}});
      if (piece.fused_gate_up()) name = absl::StrReplaceAll(name, {{"gate_proj", "gate_up_proj"}});
      ASSERT_TRUE(by_name.contains(name)) << name;
      const internal::v1::PlannedTensor& planned = *by_name[name];
      ASSERT_EQ(planned.ops_size(), 1) << name;
      EXPECT_EQ(planned.ops(0).shard_index(), s);
      EXPECT_EQ(planned.ops(0).count(), 1);
      EXPECT_EQ(Assemble(planned, published),
                published.shard_bytes[s].substr(piece.byte_offset(), piece.byte_length()))
          << name;
    }
  }
}

const internal::v1::PlannedTensor* FindPlanned(
    const std::vector<internal::v1::PlannedTensor>& plan, absl::string_view name) {
  for (const internal::v1::PlannedTensor& planned : plan) {
    if (planned.tensor().spec().name() == name) return &planned;
  }
  return nullptr;
}

TEST(ReshardTest, RowSplitSliceIsOneStridedOp) {
  const Published published =
      PublishModel(type::v1::EXPERT_LAYOUT_PER_EXPERT, type::v1::DTYPE_F32, {});
  weightstore::v1::TargetLayout target;
  target.set_tp_rank(1);
  target.set_tp_size(2);
  auto plan =
      PlanReads(published.manifest, target, {"model.layers.0.self_attn.o_proj.lora_A.weight"});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 1);
  // [3, 8] -> columns 4..7: 3 rows of 16 bytes, 32 bytes apart in the source.
  ASSERT_EQ((*plan)[0].ops_size(), 1);
  const internal::v1::CopyOp& op = (*plan)[0].ops(0);
  EXPECT_EQ(op.length(), 16);
  EXPECT_EQ(op.count(), 3);
  EXPECT_EQ(op.src_stride(), 32);
  EXPECT_EQ(op.dst_stride(), 16);
  EXPECT_EQ(op.dst_offset(), 0);
}

TEST(ReshardTest, ConsecutivePerExpertPiecesMergeIntoOneOp) {
  const Published published = PublishModel(type::v1::EXPERT_LAYOUT_PER_EXPERT, type::v1::DTYPE_BF16,
                                           {.fuse_gate_up = false, .stack_experts = false});
  weightstore::v1::TargetLayout target;
  target.set_naming(weightstore::v1::TENSOR_NAMING_ENGINE_NATIVE);
  auto plan = PlanReads(published.manifest, target, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  const internal::v1::PlannedTensor* down =
      FindPlanned(*plan, "model.layers.2.mlp.experts.down_proj.lora_B.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_THAT(down->tensor().spec().shape(), ElementsAre(4, 8, 3));
  EXPECT_EQ(down->tensor().expert_begin(), 0);
  EXPECT_EQ(down->tensor().expert_end(), 4);
  ASSERT_EQ(down->ops_size(), 1);
  EXPECT_EQ(down->ops(0).length(), 4 * 8 * 3 * 2);
}

// A fused piece may concatenate along any dimension; here along dim 1 ([r, 2*in]).
TEST(ReshardTest, ReadsPiecesFusedAlongDimOne) {
  Published published = PublishModel(type::v1::EXPERT_LAYOUT_SHARED, type::v1::DTYPE_F32,
                                     {.fuse_gate_up = false, .stack_experts = false});
  const std::string gate = "model.layers.0.mlp.gate_proj.lora_A.weight";  // [3, 8]
  const std::string up = "model.layers.0.mlp.up_proj.lora_A.weight";
  auto& pieces = *published.manifest.mutable_shards(0)->mutable_pieces();
  pieces.erase(std::remove_if(pieces.begin(), pieces.end(),
                              [&](const weightstore::v1::ShardPiece& piece) {
                                return piece.tensor_name() == gate || piece.tensor_name() == up;
                              }),
               pieces.end());
  std::string fused;
  for (int row = 0; row < 3; ++row) {
    fused += published.canonical.at(gate).substr(row * 32, 32);
    fused += published.canonical.at(up).substr(row * 32, 32);
  }
  weightstore::v1::Shard& shard = *published.manifest.add_shards();
  shard.set_byte_size(fused.size());
  weightstore::v1::ShardPiece& piece = *shard.add_pieces();
  piece.set_tensor_name(gate);
  piece.set_fused_gate_up(true);
  piece.set_fused_dim(1);
  for (int64_t size : {3, 8}) piece.add_slice()->set_size(size);
  piece.set_byte_length(fused.size());
  published.shard_bytes.push_back(fused);
  ASSERT_TRUE(ValidateManifest(published.manifest).ok()) << ValidateManifest(published.manifest);
  for (bool fuse : {false, true}) {
    weightstore::v1::TargetLayout target;
    target.set_fuse_gate_up(fuse);
    target.set_tp_size(2);
    ExpectMatchesHandSlicing(published, target);
  }
}

TEST(ReshardTest, SelectsRequestedTensorsInNameOrder) {
  const Published published = PublishModel(type::v1::EXPERT_LAYOUT_PER_EXPERT, type::v1::DTYPE_BF16,
                                           {.tp_size = 2, .ep_size = 2});
  weightstore::v1::TargetLayout target;
  target.set_dtype(type::v1::DTYPE_F16);  // does not change the plan
  auto plan = PlanReads(published.manifest, target,
                        {"model.layers.2.mlp.experts.3.up_proj.lora_B.weight",
                         "model.layers.0.self_attn.k_proj.lora_A.weight"});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 2);
  EXPECT_EQ((*plan)[0].tensor().spec().name(), "model.layers.0.self_attn.k_proj.lora_A.weight");
  EXPECT_EQ((*plan)[1].tensor().spec().name(),
            "model.layers.2.mlp.experts.3.up_proj.lora_B.weight");
  EXPECT_EQ((*plan)[1].tensor().spec().dtype(), type::v1::DTYPE_BF16);
  EXPECT_EQ((*plan)[1].tensor().byte_size(), 4 * 3 * 2);
}

struct BadLayout {
  std::string name;
  weightstore::v1::TargetLayout target;
  std::vector<std::string> tensor_names;
  std::string message;
};

weightstore::v1::TargetLayout Layout(absl::string_view text_proto_fields) {
  weightstore::v1::TargetLayout target;
  EXPECT_TRUE(
      google::protobuf::TextFormat::ParseFromString(std::string(text_proto_fields), &target));
  return target;
}

class PlanReadsErrorTest : public ::testing::TestWithParam<BadLayout> {};

TEST_P(PlanReadsErrorTest, RejectsWithInvalidArgument) {
  const Published published = PublishModel(type::v1::EXPERT_LAYOUT_PER_EXPERT, type::v1::DTYPE_BF16,
                                           {.tp_size = 2, .ep_size = 2});
  const absl::StatusOr<std::vector<internal::v1::PlannedTensor>> plan =
      PlanReads(published.manifest, GetParam().target, GetParam().tensor_names);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << plan.status();
  EXPECT_THAT(plan.status().message(), HasSubstr(GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(
    AllRules, PlanReadsErrorTest,
    ::testing::Values(
        BadLayout{"TpRankNotBelowSize", Layout("tp_rank: 2 tp_size: 2"), {}, "target.tp: rank 2"},
        BadLayout{"TpRankWithoutSize", Layout("tp_rank: 1"), {}, "target.tp: rank 1 of size 1"},
        BadLayout{"NegativeTpRank", Layout("tp_rank: -1 tp_size: 2"), {}, "rank -1"},
        BadLayout{"TpSizeTooBig", Layout("tp_size: 2048"), {}, "size 2048"},
        BadLayout{"NegativeEpSize", Layout("ep_size: -2"), {}, "target.ep: rank 0 of size -2"},
        BadLayout{"EpRankNotBelowSize", Layout("ep_rank: 4 ep_size: 4"), {}, "target.ep: rank 4"},
        BadLayout{"ExpertTpRank",
                  Layout("expert_tp_rank: 3 expert_tp_size: 2"),
                  {},
                  "target.expert_tp: rank 3"},
        BadLayout{"TpNotDividing", Layout("tp_size: 3"), {}, "not divisible by 3"},
        BadLayout{"EpNotDividing", Layout("ep_size: 3"), {}, "size 4 not divisible by 3"},
        BadLayout{"ExpertTpNotDividing",
                  Layout("expert_tp_size: 8"),
                  {},
                  "model.layers.1.mlp.experts.{e}.down_proj.lora_A.weight': size 4 not divisible "
                  "by 8"},
        BadLayout{"UnknownNaming", Layout("naming: 7"), {}, "target.naming: 7"},
        BadLayout{"IntegerDtype", Layout("dtype: DTYPE_I32"), {}, "target.dtype: 5"},
        BadLayout{"UnknownTensor",
                  Layout(""),
                  {"model.layers.9.mlp.up_proj.lora_A.weight"},
                  "unknown target tensor 'model.layers.9.mlp.up_proj.lora_A.weight'"},
        BadLayout{"CanonicalNameWhenStacked",
                  Layout("stack_experts: true"),
                  {"model.layers.1.mlp.experts.{e}.down_proj.lora_A.weight"},
                  "unknown target tensor"},
        BadLayout{"UnfusedNameWhenFused",
                  Layout("fuse_gate_up: true"),
                  {"model.layers.0.mlp.up_proj.lora_A.weight"},
                  "unknown target tensor"}),
    [](const auto& info) { return info.param.name; });

TEST(ReshardTest, RejectsTargetNameClash) {
  weightstore::v1::CanonicalTensor per_expert, shared;
  per_expert.mutable_spec()->set_name("model.layers.1.mlp.experts.{e}.down_proj.lora_A.weight");
  per_expert.set_num_experts(2);
  shared.mutable_spec()->set_name("model.layers.1.mlp.experts.down_proj.lora_A.weight");
  for (weightstore::v1::CanonicalTensor* tensor : {&per_expert, &shared}) {
    tensor->mutable_spec()->set_dtype(type::v1::DTYPE_F32);
    tensor->mutable_spec()->add_shape(kRank);
    tensor->mutable_spec()->add_shape(4);
  }
  const Published published =
      Publish({per_expert, shared}, type::v1::EXPERT_LAYOUT_PER_EXPERT, transfer::ProducerLayout{});
  EXPECT_TRUE(PlanReads(published.manifest, weightstore::v1::TargetLayout(), {}).ok());
  weightstore::v1::TargetLayout stacked;
  stacked.set_stack_experts(true);
  EXPECT_THAT(PlanReads(published.manifest, stacked, {}).status().message(),
              HasSubstr("two target tensors named "
                        "'model.layers.1.mlp.experts.down_proj.lora_A.weight'"));
  // Which the store checks at BeginPublish: the embedded engine always stacks.
  const absl::Status stackable = CheckStackable(published.manifest);
  EXPECT_EQ(stackable.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(stackable.message(), HasSubstr("with experts stacked, two target tensors named"));
  EXPECT_TRUE(CheckStackable(PublishModel(type::v1::EXPERT_LAYOUT_PER_EXPERT, type::v1::DTYPE_BF16,
                                          transfer::ProducerLayout{})
                                 .manifest)
                  .ok());
}

}  // namespace
}  // namespace tandem::weight_store
