#include "services/weight_store/manifest.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transfer/lora_layout.h"
#include "transfer/lora_testing.h"

namespace tandem::weight_store {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

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
    {"EmptyAdapter", [](weightstore::v1::Manifest& m) { m.clear_adapter_name(); }, {"bad adapter_name: ''"}},
    {"AdapterWithSpace",
     [](weightstore::v1::Manifest& m) { m.set_adapter_name("a b"); },
     {"bad adapter_name: 'a b'"}},
    {"LongAdapter",
     [](weightstore::v1::Manifest& m) { m.set_adapter_name(std::string(129, 'a')); },
     {"bad adapter_name"}},
    {"VersionZero", [](weightstore::v1::Manifest& m) { m.set_version(0); }, {"policy/job-1", "version 0 < 1"}},
    {"EncodedOver64MiB",
     [](weightstore::v1::Manifest& m) { (*m.mutable_labels())["notes"] = std::string(64 << 20, 'x'); },
     {"policy/job-1@3", "manifest encodes to", "at most 64 MiB"}},
    {"RankZero",
     [](weightstore::v1::Manifest& m) { m.mutable_lora()->set_rank(0); },
     {"policy/job-1@3", "lora.rank: 0"}},
    {"RankTooBig", [](weightstore::v1::Manifest& m) { m.mutable_lora()->set_rank(1025); }, {"lora.rank: 1025"}},
    {"NegativeAlpha", [](weightstore::v1::Manifest& m) { m.mutable_lora()->set_alpha(-1); }, {"lora.alpha: -1"}},
    {"NanAlpha",
     [](weightstore::v1::Manifest& m) { m.mutable_lora()->set_alpha(std::nanf("")); },
     {"lora.alpha"}},
    {"InfiniteAlpha",
     [](weightstore::v1::Manifest& m) { m.mutable_lora()->set_alpha(std::numeric_limits<float>::infinity()); },
     {"lora.alpha: inf"}},
    {"DropoutOne", [](weightstore::v1::Manifest& m) { m.mutable_lora()->set_dropout(1); }, {"lora.dropout: 1"}},
    {"UnknownModule",
     [](weightstore::v1::Manifest& m) { m.mutable_lora()->add_target_modules("lm_head"); },
     {"'lm_head'"}},
    {"DuplicateModule",
     [](weightstore::v1::Manifest& m) {
       m.mutable_lora()->add_target_modules("up_proj");
       m.mutable_lora()->add_target_modules("up_proj");
     },
     {"duplicate 'up_proj'"}},
    {"LayoutUnset",
     [](weightstore::v1::Manifest& m) { m.mutable_lora()->set_expert_layout(type::v1::EXPERT_LAYOUT_UNSPECIFIED); },
     {"lora.expert_layout"}},
    {"NoTensors",
     [](weightstore::v1::Manifest& m) {
       m.clear_tensors();
       m.clear_shards();
     },
     {"tensors: 0 entries"}},
    {"DuplicateTensor",
     [](weightstore::v1::Manifest& m) { *m.add_tensors() = m.tensors(0); },
     {"duplicate name 'model.layers.0.mlp.down_proj.lora_A.weight'"}},
    {"EmptyTensorName",
     EditTensor(kQ, [](auto& t) { t.mutable_spec()->clear_name(); }),
     {"name of 0 bytes"}},
    {"LongTensorName",
     EditTensor(kQ, [](auto& t) { t.mutable_spec()->set_name(std::string(513, 'n')); }),
     {"name of 513 bytes"}},
    {"DtypeUnset",
     EditTensor(kQ, [](auto& t) { t.mutable_spec()->set_dtype(type::v1::DTYPE_UNSPECIFIED); }),
     {std::string(kQ), "dtype 0"}},
    {"NineDims",
     EditTensor(kQ,
                [](auto& t) {
                  for (int i = 0; i < 7; ++i) t.mutable_spec()->add_shape(1);
                }),
     {"9 dims > 8"}},
    {"ZeroDim",
     EditTensor(kQ, [](auto& t) { t.mutable_spec()->set_shape(1, 0); }),
     {"shape[1] = 0 < 1"}},
    {"TooManyBytes",
     EditTensor(kQ,
                [](auto& t) {
                  t.mutable_spec()->set_shape(0, int64_t{1} << 40);
                  t.mutable_spec()->set_shape(1, int64_t{1} << 40);
                }),
     {"more than 72057594037927936 bytes"}},
    {"PlaceholderWithoutExperts",
     EditTensor(kExpertDown, [](auto& t) { t.set_num_experts(0); }),
     {std::string(kExpertDown), "num_experts 0 not in 1..32767"}},
    {"TooManyExperts",
     EditTensor(kExpertDown, [](auto& t) { t.set_num_experts(32768); }),
     {"num_experts 32768"}},
    {"ExpertsWithoutPlaceholder",
     EditTensor(kQ, [](auto& t) { t.set_num_experts(2); }),
     {"num_experts 2 != 0"}},
    {"PlaceholderTwice",
     EditTensor(kExpertDown,
                [](auto& t) { t.mutable_spec()->set_name("x.{e}.y.{e}.lora_A.weight"); }),
     {"'{e}' more than once"}},
    {"NoShards", [](weightstore::v1::Manifest& m) { m.clear_shards(); }, {"shards: 0 entries"}},
    {"TooManyShards",
     [](weightstore::v1::Manifest& m) {
       for (int i = 0; i < 65536; ++i) m.add_shards();
     },
     {"shards: 65540 entries not in 1..65536"}},
    {"NegativeProducerRank",
     [](weightstore::v1::Manifest& m) { m.mutable_shards(1)->set_producer_rank(-1); },
     {"shard 1: producer_rank -1"}},
    {"EmptyShard",
     [](weightstore::v1::Manifest& m) { m.mutable_shards(0)->set_byte_size(0); },
     {"shard 0: byte_size 0"}},
    {"HugeShard",
     [](weightstore::v1::Manifest& m) { m.mutable_shards(0)->set_byte_size((1ull << 40) + 1); },
     {"byte_size 1099511627777"}},
    {"ShardWithoutPieces",
     [](weightstore::v1::Manifest& m) {
       weightstore::v1::Shard& shard = *m.add_shards();
       shard.set_byte_size(1);
     },
     {"shard 4: no pieces"}},
    {"UnknownTensor",
     EditPiece(kQ, [](auto& p) { p.set_tensor_name("nope"); }),
     {"piece", "(tensor 'nope'): unknown tensor"}},
    {"ExpertRangeOnPlainTensor",
     EditPiece(kQ, [](auto& p) { p.set_expert_end(1); }),
     {"expert range [0, 1) on a tensor without experts"}},
    {"EmptyExpertRange",
     EditPiece(kExpertDown, [](auto& p) { p.set_expert_end(0); }),
     {"expert range [0, 0) not within [0, 4)"}},
    {"ExpertRangePastEnd",
     EditPiece(kExpertDown, [](auto& p) { p.set_expert_end(5); }),
     {"expert range [0, 5)"}},
    {"NegativeExpert",
     EditPiece(kExpertDown, [](auto& p) { p.set_expert_begin(-1); }),
     {"expert range [-1, 2)"}},
    {"FusedWithoutGate",
     EditPiece(kQ, [](auto& p) { p.set_fused_gate_up(true); }),
     {"fused_gate_up on a tensor without 'gate_proj'"}},
    {"FusedPartnerMissing",
     [](weightstore::v1::Manifest& m) {
       FindTensor(m, "model.layers.0.mlp.up_proj.lora_A.weight")
           ->mutable_spec()
           ->set_name("model.layers.0.mlp.up2_proj.lora_A.weight");
     },
     {"partner 'model.layers.0.mlp.up_proj.lora_A.weight' missing"}},
    {"FusedPartnerOtherDtype",
     EditTensor("model.layers.0.mlp.up_proj.lora_A.weight",
                [](auto& t) { t.mutable_spec()->set_dtype(type::v1::DTYPE_F32); }),
     {"differs in dtype, shape or experts"}},
    {"FusedDimTooBig",
     EditPiece(kDenseGate, [](auto& p) { p.set_fused_dim(2); }),
     {"fused_dim 2 not in [0, 2)"}},
    {"SliceMissing",
     EditPiece(kQ, [](auto& p) { p.mutable_slice()->RemoveLast(); }),
     {"1 slice entries for 2 dims"}},
    {"SlicePastEnd",
     EditPiece(kQ, [](auto& p) { p.mutable_slice(0)->set_offset(5); }),
     {"slice[0] offset 5 size 4 not within dim 8"}},
    {"NegativeSliceOffset",
     EditPiece(kQ, [](auto& p) { p.mutable_slice(0)->set_offset(-1); }),
     {"slice[0] offset -1"}},
    {"EmptySlice",
     EditPiece(kQ, [](auto& p) { p.mutable_slice(1)->set_size(0); }),
     {"slice[1] offset 0 size 0"}},
    {"ByteLengthWrong",
     EditPiece(kQ, [](auto& p) { p.set_byte_length(p.byte_length() + 2); }),
     {"byte_length 26 != 24 of the slice"}},
    {"PieceOutsideShard",
     EditPiece(kQ, [](auto& p) { p.set_byte_offset(p.byte_offset() + (1ull << 41)); }),
     {"beyond shard byte_size"}},
    {"PiecesOverlapInBytes",
     [](weightstore::v1::Manifest& m) {
       weightstore::v1::Shard& shard = *m.mutable_shards(0);
       shard.mutable_pieces(1)->set_byte_offset(shard.pieces(0).byte_offset() + 2);
     },
     {"shard 0: pieces 0 and 1 overlap in bytes"}},
    {"MissingCoverage",
     [](weightstore::v1::Manifest& m) { m.mutable_shards(1)->mutable_pieces()->RemoveLast(); },
     {"pieces cover", "elements"}},
    {"OverlappingCoverage",
     [](weightstore::v1::Manifest& m) {
       // A second copy of the first piece, in another shard.
       weightstore::v1::ShardPiece copy = m.shards(0).pieces(0);
       copy.set_byte_offset(0);
       weightstore::v1::Shard& shard = *m.add_shards();
       shard.set_byte_size(copy.byte_length());
       *shard.add_pieces() = copy;
     },
     {"shard 0 piece 0 and shard 4 piece 0 overlap"}},
    {"OversizedBaseModel",
     [](weightstore::v1::Manifest& m) { m.set_base_model(std::string(4097, 'm')); },
     {"base_model has 4097 bytes; at most 4096"}},
    {"OversizedLabelKey",
     [](weightstore::v1::Manifest& m) { (*m.mutable_labels())[std::string(257, 'k')] = "v"; },
     {"labels key has 257 bytes; at most 256"}},
    {"OversizedLabelValue",
     [](weightstore::v1::Manifest& m) { (*m.mutable_labels())["note"] = std::string(4097, 'v'); },
     {"labels[note] has 4097 bytes; at most 4096"}},
    {"TooManyLabels",
     [](weightstore::v1::Manifest& m) {
       for (int i = 0; i < 65; ++i) (*m.mutable_labels())[absl::StrCat("k", i)] = "v";
     },
     {"labels has", "entries; at most 64"}},
    {"ShiftedSliceLeavesGapAndOverlap",
     EditPiece(kQ, [](auto& p) { p.mutable_slice(0)->set_offset(2); }),
     {std::string(kQ), "overlap"}},
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
