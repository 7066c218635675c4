#include "services/weight_store/manifest.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transfer/lora_layout.h"
#include "transfer/lora_testing.h"

namespace tandem::weight_store {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;

type::v1::LoraConfig Lora(type::v1::ExpertLayout layout) {
  type::v1::LoraConfig lora;
  lora.set_rank(3);
  lora.set_expert_layout(layout);
  return lora;
}

// The manifest of the small test model published by every rank of a TP x EP producer.
weightstore::v1::Manifest Publish(type::v1::ExpertLayout expert_layout, type::v1::Dtype dtype,
                                  transfer::ProducerLayout layout) {
  weightstore::v1::Manifest manifest;
  manifest.set_adapter_name("policy/job-1");
  manifest.set_version(3);
  *manifest.mutable_lora() = Lora(expert_layout);
  const std::vector<weightstore::v1::CanonicalTensor> tensors =
      *transfer::CanonicalTensorsFor(transfer::kTinyModel, manifest.lora(), dtype);
  manifest.mutable_tensors()->Add(tensors.begin(), tensors.end());
  const absl::flat_hash_map<std::string, std::string> canonical =
      transfer::RandomCanonicalBytes(tensors, 1);
  const int tp_size = layout.tp_size;
  for (int rank = 0; rank < tp_size * layout.ep_size; ++rank) {
    layout.tp_rank = rank % tp_size;
    layout.ep_rank = rank / tp_size;
    auto shard = transfer::BuildProducerShard(tensors, canonical, layout, rank);
    EXPECT_TRUE(shard.ok()) << shard.status();
    if (shard.ok() && shard->first.byte_size() > 0) *manifest.add_shards() = shard->first;
  }
  return manifest;
}

weightstore::v1::Manifest Trainer() {
  return Publish(type::v1::EXPERT_LAYOUT_PER_EXPERT, type::v1::DTYPE_BF16,
                 {.tp_size = 2, .ep_size = 2});
}

// The first piece of `manifest` on tensor `name`.
weightstore::v1::ShardPiece* FindPiece(weightstore::v1::Manifest& manifest, absl::string_view name,
                                       int* shard_index) {
  for (int s = 0; s < manifest.shards_size(); ++s) {
    for (weightstore::v1::ShardPiece& piece : *manifest.mutable_shards(s)->mutable_pieces()) {
      if (piece.tensor_name() == name) {
        *shard_index = s;
        return &piece;
      }
    }
  }
  return nullptr;
}

weightstore::v1::CanonicalTensor* FindTensor(weightstore::v1::Manifest& manifest,
                                             absl::string_view name) {
  for (weightstore::v1::CanonicalTensor& tensor : *manifest.mutable_tensors()) {
    if (tensor.spec().name() == name) return &tensor;
  }
  return nullptr;
}

constexpr absl::string_view kQ = "model.layers.0.self_attn.q_proj.lora_B.weight";
constexpr absl::string_view kExpertDown = "model.layers.1.mlp.experts.{e}.down_proj.lora_A.weight";
constexpr absl::string_view kDenseGate = "model.layers.0.mlp.gate_proj.lora_A.weight";

TEST(ValidateManifestTest, AcceptsProducerManifests) {
  for (auto layout : {type::v1::EXPERT_LAYOUT_PER_EXPERT, type::v1::EXPERT_LAYOUT_SHARED,
                      type::v1::EXPERT_LAYOUT_SHARED_OUTER}) {
    for (auto dtype : {type::v1::DTYPE_BF16, type::v1::DTYPE_F32}) {
      for (const transfer::ProducerLayout& producer :
           {transfer::ProducerLayout{.tp_size = 2, .ep_size = 2},
            transfer::ProducerLayout{.fuse_gate_up = false, .stack_experts = false},
            transfer::ProducerLayout{.tp_size = 4, .ep_size = 4, .stack_experts = false}}) {
        EXPECT_TRUE(ValidateManifest(Publish(layout, dtype, producer)).ok())
            << ValidateManifest(Publish(layout, dtype, producer));
      }
    }
  }
}

struct BadCase {
  std::string name;
  std::function<void(weightstore::v1::Manifest&)> mutate;
  std::vector<std::string> message_parts;
  // The field's path from the BeginPublishRequest, as a regular expression.
  std::string field;
};

class ValidateManifestErrorTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(ValidateManifestErrorTest, RejectsWithNamedValue) {
  weightstore::v1::Manifest manifest = Trainer();
  ASSERT_TRUE(ValidateManifest(manifest).ok());
  GetParam().mutate(manifest);
  const absl::Status status = ValidateManifest(manifest);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  for (const std::string& part : GetParam().message_parts) {
    EXPECT_THAT(status.message(), HasSubstr(part));
  }
  EXPECT_EQ(ErrorReason(status), "INVALID_FIELD") << status;
  const std::vector<FieldViolation> violations = FieldViolations(status);
  ASSERT_EQ(violations.size(), 1u) << status;
  EXPECT_THAT(violations[0].field, MatchesRegex(GetParam().field)) << status;
}

// Applies `edit` to the first piece of tensor `name`.
std::function<void(weightstore::v1::Manifest&)> EditPiece(
    absl::string_view name, std::function<void(weightstore::v1::ShardPiece&)> edit) {
  return [name, edit](weightstore::v1::Manifest& manifest) {
    int shard;
    weightstore::v1::ShardPiece* piece = FindPiece(manifest, name, &shard);
    ASSERT_NE(piece, nullptr);
    edit(*piece);
  };
}

std::function<void(weightstore::v1::Manifest&)> EditTensor(
    absl::string_view name, std::function<void(weightstore::v1::CanonicalTensor&)> edit) {
  return [name, edit](weightstore::v1::Manifest& manifest) {
    weightstore::v1::CanonicalTensor* tensor = FindTensor(manifest, name);
    ASSERT_NE(tensor, nullptr);
    edit(*tensor);
  };
}

const BadCase kBadCases[] = {
    {"EmptyAdapter", [](weightstore::v1::Manifest& m) { m.clear_adapter_name(); }, {"bad adapter_name: ''"},
     R"re(manifest\.adapter_name)re"},
    {"AdapterWithSpace",
     [](weightstore::v1::Manifest& m) { m.set_adapter_name("a b"); },
     {"bad adapter_name: 'a b'"},
     R"re(manifest\.adapter_name)re"},
    {"LongAdapter",
     [](weightstore::v1::Manifest& m) { m.set_adapter_name(std::string(129, 'a')); },
     {"bad adapter_name"},
     R"re(manifest\.adapter_name)re"},
    {"VersionZero", [](weightstore::v1::Manifest& m) { m.set_version(0); }, {"policy/job-1", "version 0 < 1"},
     R"re(manifest\.version)re"},
    {"EncodedOver64MiB",
     [](weightstore::v1::Manifest& m) { (*m.mutable_labels())["notes"] = std::string(64 << 20, 'x'); },
     {"policy/job-1@3", "manifest encodes to", "at most 64 MiB"},
     R"re(manifest)re"},
    {"RankZero",
     [](weightstore::v1::Manifest& m) { m.mutable_lora()->set_rank(0); },
     {"policy/job-1@3", "lora.rank: 0"},
     R"re(manifest\.lora\.rank)re"},
    {"RankTooBig", [](weightstore::v1::Manifest& m) { m.mutable_lora()->set_rank(1025); }, {"lora.rank: 1025"},
     R"re(manifest\.lora\.rank)re"},
    {"NegativeAlpha", [](weightstore::v1::Manifest& m) { m.mutable_lora()->set_alpha(-1); }, {"lora.alpha: -1"},
     R"re(manifest\.lora\.alpha)re"},
    {"NanAlpha",
     [](weightstore::v1::Manifest& m) { m.mutable_lora()->set_alpha(std::nanf("")); },
     {"lora.alpha"},
     R"re(manifest\.lora\.alpha)re"},
    {"InfiniteAlpha",
     [](weightstore::v1::Manifest& m) { m.mutable_lora()->set_alpha(std::numeric_limits<float>::infinity()); },
     {"lora.alpha: inf"},
     R"re(manifest\.lora\.alpha)re"},
    {"DropoutOne", [](weightstore::v1::Manifest& m) { m.mutable_lora()->set_dropout(1); }, {"lora.dropout: 1"},
     R"re(manifest\.lora\.dropout)re"},
    {"UnknownModule",
     [](weightstore::v1::Manifest& m) { m.mutable_lora()->add_target_modules("lm_head"); },
     {"'lm_head'"},
     R"re(manifest\.lora\.target_modules\[0\])re"},
    {"DuplicateModule",
     [](weightstore::v1::Manifest& m) {
       m.mutable_lora()->add_target_modules("up_proj");
       m.mutable_lora()->add_target_modules("up_proj");
     },
     {"duplicate 'up_proj'"},
     R"re(manifest\.lora\.target_modules\[1\])re"},
    {"LayoutUnset",
     [](weightstore::v1::Manifest& m) { m.mutable_lora()->set_expert_layout(type::v1::EXPERT_LAYOUT_UNSPECIFIED); },
     {"lora.expert_layout"},
     R"re(manifest\.lora\.expert_layout)re"},
    {"NoTensors",
     [](weightstore::v1::Manifest& m) {
       m.clear_tensors();
       m.clear_shards();
     },
     {"tensors: 0 entries"},
     R"re(manifest\.tensors)re"},
    {"DuplicateTensor",
     [](weightstore::v1::Manifest& m) { *m.add_tensors() = m.tensors(0); },
     {"duplicate name 'model.layers.0.mlp.down_proj.lora_A.weight'"},
     R"re(manifest\.tensors\[[0-9]+\]\.spec\.name)re"},
    {"EmptyTensorName",
     EditTensor(kQ, [](auto& t) { t.mutable_spec()->clear_name(); }),
     {"name of 0 bytes"},
     R"re(manifest\.tensors\[[0-9]+\]\.spec\.name)re"},
    {"LongTensorName",
     EditTensor(kQ, [](auto& t) { t.mutable_spec()->set_name(std::string(513, 'n')); }),
     {"name of 513 bytes"},
     R"re(manifest\.tensors\[[0-9]+\]\.spec\.name)re"},
    {"DtypeUnset",
     EditTensor(kQ, [](auto& t) { t.mutable_spec()->set_dtype(type::v1::DTYPE_UNSPECIFIED); }),
     {std::string(kQ), "dtype 0"},
     R"re(manifest\.tensors\[[0-9]+\]\.spec\.dtype)re"},
    {"NineDims",
     EditTensor(kQ,
                [](auto& t) {
                  for (int i = 0; i < 7; ++i) t.mutable_spec()->add_shape(1);
                }),
     {"9 dims > 8"},
     R"re(manifest\.tensors\[[0-9]+\]\.spec\.shape)re"},
    {"ZeroDim",
     EditTensor(kQ, [](auto& t) { t.mutable_spec()->set_shape(1, 0); }),
     {"shape[1] = 0 < 1"},
     R"re(manifest\.tensors\[[0-9]+\]\.spec\.shape\[1\])re"},
    {"TooManyBytes",
     EditTensor(kQ,
                [](auto& t) {
                  t.mutable_spec()->set_shape(0, int64_t{1} << 40);
                  t.mutable_spec()->set_shape(1, int64_t{1} << 40);
                }),
     {"more than 72057594037927936 bytes"},
     R"re(manifest\.tensors\[[0-9]+\]\.spec\.shape)re"},
    {"PlaceholderWithoutExperts",
     EditTensor(kExpertDown, [](auto& t) { t.set_num_experts(0); }),
     {std::string(kExpertDown), "num_experts 0 not in 1..32767"},
     R"re(manifest\.tensors\[[0-9]+\]\.num_experts)re"},
    {"TooManyExperts",
     EditTensor(kExpertDown, [](auto& t) { t.set_num_experts(32768); }),
     {"num_experts 32768"},
     R"re(manifest\.tensors\[[0-9]+\]\.num_experts)re"},
    {"ExpertsWithoutPlaceholder",
     EditTensor(kQ, [](auto& t) { t.set_num_experts(2); }),
     {"num_experts 2 != 0"},
     R"re(manifest\.tensors\[[0-9]+\]\.num_experts)re"},
    {"PlaceholderTwice",
     EditTensor(kExpertDown,
                [](auto& t) { t.mutable_spec()->set_name("x.{e}.y.{e}.lora_A.weight"); }),
     {"'{e}' more than once"},
     R"re(manifest\.tensors\[[0-9]+\]\.spec\.name)re"},
    {"NoShards", [](weightstore::v1::Manifest& m) { m.clear_shards(); }, {"shards: 0 entries"},
     R"re(manifest\.shards)re"},
    {"TooManyShards",
     [](weightstore::v1::Manifest& m) {
       for (int i = 0; i < 65536; ++i) m.add_shards();
     },
     {"shards: 65540 entries not in 1..65536"},
     R"re(manifest\.shards)re"},
    {"NegativeProducerRank",
     [](weightstore::v1::Manifest& m) { m.mutable_shards(1)->set_producer_rank(-1); },
     {"shard 1: producer_rank -1"},
     R"re(manifest\.shards\[1\]\.producer_rank)re"},
    {"EmptyShard",
     [](weightstore::v1::Manifest& m) { m.mutable_shards(0)->set_byte_size(0); },
     {"shard 0: byte_size 0"},
     R"re(manifest\.shards\[0\]\.byte_size)re"},
    {"HugeShard",
     [](weightstore::v1::Manifest& m) { m.mutable_shards(0)->set_byte_size((1ull << 40) + 1); },
     {"byte_size 1099511627777"},
     R"re(manifest\.shards\[0\]\.byte_size)re"},
    {"ShardWithoutPieces",
     [](weightstore::v1::Manifest& m) {
       weightstore::v1::Shard& shard = *m.add_shards();
       shard.set_byte_size(1);
     },
     {"shard 4: no pieces"},
     R"re(manifest\.shards\[4\]\.pieces)re"},
    {"UnknownTensor",
     EditPiece(kQ, [](auto& p) { p.set_tensor_name("nope"); }),
     {"piece", "(tensor 'nope'): unknown tensor"},
     R"re(manifest\.shards\[[0-9]+\]\.pieces\[[0-9]+\]\.tensor_name)re"},
    {"ExpertRangeOnPlainTensor",
     EditPiece(kQ, [](auto& p) { p.set_expert_end(1); }),
     {"expert range [0, 1) on a tensor without experts"},
     R"re(manifest\.shards\[[0-9]+\]\.pieces\[[0-9]+\]\.expert_end)re"},
    {"EmptyExpertRange",
     EditPiece(kExpertDown, [](auto& p) { p.set_expert_end(0); }),
     {"expert range [0, 0) not within [0, 4)"},
     R"re(manifest\.shards\[[0-9]+\]\.pieces\[[0-9]+\]\.expert_end)re"},
    {"ExpertRangePastEnd",
     EditPiece(kExpertDown, [](auto& p) { p.set_expert_end(5); }),
     {"expert range [0, 5)"},
     R"re(manifest\.shards\[[0-9]+\]\.pieces\[[0-9]+\]\.expert_end)re"},
    {"NegativeExpert",
     EditPiece(kExpertDown, [](auto& p) { p.set_expert_begin(-1); }),
     {"expert range [-1, 2)"},
     R"re(manifest\.shards\[[0-9]+\]\.pieces\[[0-9]+\]\.expert_begin)re"},
    {"FusedWithoutGate",
     EditPiece(kQ, [](auto& p) { p.set_fused_gate_up(true); }),
     {"fused_gate_up on a tensor without 'gate_proj'"},
     R"re(manifest\.shards\[[0-9]+\]\.pieces\[[0-9]+\]\.fused_gate_up)re"},
    {"FusedPartnerMissing",
     [](weightstore::v1::Manifest& m) {
       FindTensor(m, "model.layers.0.mlp.up_proj.lora_A.weight")
           ->mutable_spec()
           ->set_name("model.layers.0.mlp.up2_proj.lora_A.weight");
     },
     {"partner 'model.layers.0.mlp.up_proj.lora_A.weight' missing"},
     R"re(manifest\.shards\[[0-9]+\]\.pieces\[[0-9]+\]\.fused_gate_up)re"},
    {"FusedPartnerOtherDtype",
     EditTensor("model.layers.0.mlp.up_proj.lora_A.weight",
                [](auto& t) { t.mutable_spec()->set_dtype(type::v1::DTYPE_F32); }),
     {"differs in dtype, shape or experts"},
     R"re(manifest\.shards\[[0-9]+\]\.pieces\[[0-9]+\]\.fused_gate_up)re"},
    {"FusedDimTooBig",
     EditPiece(kDenseGate, [](auto& p) { p.set_fused_dim(2); }),
     {"fused_dim 2 not in [0, 2)"},
     R"re(manifest\.shards\[[0-9]+\]\.pieces\[[0-9]+\]\.fused_dim)re"},
    {"SliceMissing",
     EditPiece(kQ, [](auto& p) { p.mutable_slice()->RemoveLast(); }),
     {"1 slice entries for 2 dims"},
     R"re(manifest\.shards\[[0-9]+\]\.pieces\[[0-9]+\]\.slice)re"},
    {"SlicePastEnd",
     EditPiece(kQ, [](auto& p) { p.mutable_slice(0)->set_offset(5); }),
     {"slice[0] offset 5 size 4 not within dim 8"},
     R"re(manifest\.shards\[[0-9]+\]\.pieces\[[0-9]+\]\.slice\[0\]\.size)re"},
    {"NegativeSliceOffset",
     EditPiece(kQ, [](auto& p) { p.mutable_slice(0)->set_offset(-1); }),
     {"slice[0] offset -1"},
     R"re(manifest\.shards\[[0-9]+\]\.pieces\[[0-9]+\]\.slice\[0\]\.offset)re"},
    {"EmptySlice",
     EditPiece(kQ, [](auto& p) { p.mutable_slice(1)->set_size(0); }),
     {"slice[1] offset 0 size 0"},
     R"re(manifest\.shards\[[0-9]+\]\.pieces\[[0-9]+\]\.slice\[1\]\.size)re"},
    {"ByteLengthWrong",
     EditPiece(kQ, [](auto& p) { p.set_byte_length(p.byte_length() + 2); }),
     {"byte_length 26 != 24 of the slice"},
     R"re(manifest\.shards\[[0-9]+\]\.pieces\[[0-9]+\]\.byte_length)re"},
    {"PieceOutsideShard",
     EditPiece(kQ, [](auto& p) { p.set_byte_offset(p.byte_offset() + (1ull << 41)); }),
     {"beyond shard byte_size"},
     R"re(manifest\.shards\[[0-9]+\]\.pieces\[[0-9]+\]\.byte_offset)re"},
    {"PiecesOverlapInBytes",
     [](weightstore::v1::Manifest& m) {
       weightstore::v1::Shard& shard = *m.mutable_shards(0);
       shard.mutable_pieces(1)->set_byte_offset(shard.pieces(0).byte_offset() + 2);
     },
     {"shard 0: pieces 0 and 1 overlap in bytes"},
     R"re(manifest\.shards\[0\]\.pieces\[1\]\.byte_offset)re"},
    {"MissingCoverage",
     [](weightstore::v1::Manifest& m) { m.mutable_shards(1)->mutable_pieces()->RemoveLast(); },
     {"pieces cover", "elements"},
     R"re(manifest\.tensors\[[0-9]+\])re"},
    {"OverlappingCoverage",
     [](weightstore::v1::Manifest& m) {
       // A second copy of the first piece, in another shard.
       weightstore::v1::ShardPiece copy = m.shards(0).pieces(0);
       copy.set_byte_offset(0);
       weightstore::v1::Shard& shard = *m.add_shards();
       shard.set_byte_size(copy.byte_length());
       *shard.add_pieces() = copy;
     },
     {"shard 0 piece 0 and shard 4 piece 0 overlap"},
     R"re(manifest\.shards\[4\]\.pieces\[0\])re"},
    {"OversizedBaseModel",
     [](weightstore::v1::Manifest& m) { m.set_base_model(std::string(4097, 'm')); },
     {"base_model has 4097 bytes; at most 4096"},
     R"re(manifest\.base_model)re"},
    {"OversizedLabelKey",
     [](weightstore::v1::Manifest& m) { (*m.mutable_labels())[std::string(257, 'k')] = "v"; },
     {"labels key has 257 bytes; at most 256"},
     R"re(manifest\.labels\["k+"\])re"},
    {"OversizedLabelValue",
     [](weightstore::v1::Manifest& m) { (*m.mutable_labels())["note"] = std::string(4097, 'v'); },
     {"labels[note] has 4097 bytes; at most 4096"},
     R"re(manifest\.labels\["note"\])re"},
    {"TooManyLabels",
     [](weightstore::v1::Manifest& m) {
       for (int i = 0; i < 65; ++i) (*m.mutable_labels())[absl::StrCat("k", i)] = "v";
     },
     {"labels has", "entries; at most 64"},
     R"re(manifest\.labels)re"},
    {"ShiftedSliceLeavesGapAndOverlap",
     EditPiece(kQ, [](auto& p) { p.mutable_slice(0)->set_offset(2); }),
     {std::string(kQ), "overlap"},
     R"re(manifest\.shards\[[0-9]+\]\.pieces\[[0-9]+\])re"},
};

INSTANTIATE_TEST_SUITE_P(AllRules, ValidateManifestErrorTest, ::testing::ValuesIn(kBadCases),
                         [](const auto& info) { return info.param.name; });

TEST(ValidateManifestTest, FusedGateCoversUpToo) {
  weightstore::v1::Manifest manifest = Trainer();
  int shard;
  weightstore::v1::ShardPiece* piece = FindPiece(manifest, kDenseGate, &shard);
  ASSERT_NE(piece, nullptr);
  ASSERT_TRUE(piece->fused_gate_up());
  // Unfused, the piece is too long for its slice; halved, up_proj loses its coverage.
  piece->set_fused_gate_up(false);
  EXPECT_THAT(ValidateManifest(manifest).message(), HasSubstr("byte_length 96 != 48"));
  piece->set_byte_length(48);
  EXPECT_THAT(ValidateManifest(manifest).message(),
              AllOf(HasSubstr("model.layers.0.mlp.up_proj.lora_A.weight"),
                    HasSubstr("pieces cover 0 of 24 elements")));
}

}  // namespace
}  // namespace tandem::weight_store
