#include "transfer/lora_layout.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "absl/types/span.h"
#include "common/checksum.h"

namespace tandem::transfer {
namespace {

constexpr absl::string_view kTargetModules[] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                "gate_proj", "up_proj", "down_proj"};
constexpr int kMaxRank = 1024;
constexpr int kMaxExperts = 32767;

bool IsColumnParallel(absl::string_view projection) {
  return projection == "q_proj" || projection == "k_proj" || projection == "v_proj" ||
         projection == "gate_proj" || projection == "up_proj";
}

bool IsRowParallel(absl::string_view projection) {
  return projection == "o_proj" || projection == "down_proj";
}

absl::Status ValidateTargetModules(const type::v1::LoraConfig& lora) {
  absl::flat_hash_set<absl::string_view> seen;
  for (const std::string& module : lora.target_modules()) {
    if (std::find(std::begin(kTargetModules), std::end(kTargetModules), module) ==
        std::end(kTargetModules)) {
      return absl::InvalidArgumentError(
          absl::StrCat("lora.target_modules: '", module, "' is not a LoRA target"));
    }
    if (!seen.insert(module).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("lora.target_modules: duplicate '", module, "'"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateModelShape(const ModelShape& model) {
  bool has_moe = false;
  bool has_dense = false;
  for (int layer = 0; layer < model.num_layers; ++layer) {
    (model.IsDenseLayer(layer) ? has_dense : has_moe) = true;
  }
  if (model.num_layers < 1 || model.num_dense_layers < 0 ||
      model.num_dense_layers > model.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("model: num_dense_layers ",
                                                   model.num_dense_layers, " not in 0..num_layers ",
                                                   model.num_layers));
  }
  if (model.hidden < 1 || model.q_out < 1 || model.kv_out < 1 ||
      (has_dense && model.dense_ffn < 1) || (has_moe && model.expert_ffn < 1)) {
    return absl::InvalidArgumentError(
        "model: hidden, q_out, kv_out and the used ffn sizes must be >= 1");
  }
  if (has_moe && (model.num_experts < 1 || model.num_experts > kMaxExperts)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: num_experts ", model.num_experts, " not in 1..", kMaxExperts));
  }
  return absl::OkStatus();
}

// Whether lora_A and lora_B of an expert projection are per expert (else shared by the experts).
std::pair<bool, bool> PerExpertSides(type::v1::ExpertLayout layout, absl::string_view projection) {
  switch (layout) {
    case type::v1::EXPERT_LAYOUT_SHARED:
      return {false, false};
    case type::v1::EXPERT_LAYOUT_SHARED_OUTER:
      // The sides that touch the hidden state (gate/up input, down output) are shared.
      return projection == "down_proj" ? std::pair{true, false} : std::pair{false, true};
    default:
      return {true, true};
  }
}

weightstore::v1::CanonicalTensor MakeTensor(std::string name, type::v1::Dtype dtype,
                                            std::vector<int64_t> shape, int num_experts) {
  weightstore::v1::CanonicalTensor tensor;
  tensor.mutable_spec()->set_name(std::move(name));
  tensor.mutable_spec()->set_dtype(dtype);
  tensor.mutable_spec()->mutable_shape()->Add(shape.begin(), shape.end());
  tensor.set_num_experts(num_experts);
  return tensor;
}

struct Projection {
  absl::string_view name;
  int64_t in = 0;
  int64_t out = 0;
};

// Adds lora_A [r, in] and lora_B [out, r] of one projection under `prefix` ("model.layers.3.mlp.").
// A side with experts > 0 is per expert, under prefix + "{e}.".
void AddProjection(absl::string_view prefix, const Projection& projection, int rank,
                   type::v1::Dtype dtype, int experts_a, int experts_b,
                   std::vector<weightstore::v1::CanonicalTensor>& tensors) {
  auto name = [&](int experts, absl::string_view side) {
    return absl::StrCat(prefix, experts > 0 ? absl::StrCat(kExpertPlaceholder, ".") : "",
                        projection.name, ".lora_", side, ".weight");
  };
  tensors.push_back(MakeTensor(name(experts_a, "A"), dtype, {rank, projection.in}, experts_a));
  tensors.push_back(MakeTensor(name(experts_b, "B"), dtype, {projection.out, rank}, experts_b));
}

void AddLayer(const ModelShape& model, const type::v1::LoraConfig& lora, type::v1::Dtype dtype,
              int layer, const absl::flat_hash_set<std::string>& targets,
              std::vector<weightstore::v1::CanonicalTensor>& tensors) {
  const std::string attention = absl::StrCat("model.layers.", layer, ".self_attn.");
  for (const Projection& projection : {Projection{"q_proj", model.hidden, model.q_out},
                                       Projection{"k_proj", model.hidden, model.kv_out},
                                       Projection{"v_proj", model.hidden, model.kv_out},
                                       Projection{"o_proj", model.q_out, model.hidden}}) {
    if (targets.contains(projection.name)) {
      AddProjection(attention, projection, lora.rank(), dtype, 0, 0, tensors);
    }
  }
  const bool dense = model.IsDenseLayer(layer);
  const int64_t ffn = dense ? model.dense_ffn : model.expert_ffn;
  const std::string mlp = absl::StrCat("model.layers.", layer, dense ? ".mlp." : ".mlp.experts.");
  for (const Projection& projection :
       {Projection{"gate_proj", model.hidden, ffn}, Projection{"up_proj", model.hidden, ffn},
        Projection{"down_proj", ffn, model.hidden}}) {
    if (!targets.contains(projection.name)) continue;
    const auto [per_expert_a, per_expert_b] = PerExpertSides(lora.expert_layout(), projection.name);
    const int experts = dense ? 0 : model.num_experts;
    AddProjection(mlp, projection, lora.rank(), dtype, per_expert_a ? experts : 0,
                  per_expert_b ? experts : 0, tensors);
  }
}

absl::Status ValidateProducerLayout(const ProducerLayout& layout, int producer_rank) {
  if (layout.tp_size < 1 || layout.tp_rank < 0 || layout.tp_rank >= layout.tp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("producer tp_rank ", layout.tp_rank, " not in 0..tp_size ", layout.tp_size));
  }
  if (layout.ep_size < 1 || layout.ep_rank < 0 || layout.ep_rank >= layout.ep_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("producer ep_rank ", layout.ep_rank, " not in 0..ep_size ", layout.ep_size));
  }
  if (producer_rank < 0) {
    return absl::InvalidArgumentError(absl::StrCat("producer_rank ", producer_rank, " < 0"));
  }
  return absl::OkStatus();
}

int64_t ElementCount(absl::Span<const int64_t> shape) {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  return count;
}

// Narrows dimension `dim` of `box` to part `part` of `parts` equal parts.
absl::Status SplitEvenly(const weightstore::v1::CanonicalTensor& tensor, int dim, int parts,
                         int part, TensorBox& box) {
  if (box.size[dim] % parts != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", tensor.spec().name(), "': size ",
                                                   box.size[dim], " not divisible by ", parts));
  }
  box.size[dim] /= parts;
  box.begin[dim] = part * box.size[dim];
  return absl::OkStatus();
}

// The part of `tensor` this producer publishes, nullopt if none (see the coverage rule in the
// header).
absl::StatusOr<std::optional<TensorBox>> ProducerBox(const weightstore::v1::CanonicalTensor& tensor,
                                                     const ProducerLayout& layout) {
  const bool whole_under_tp = TpSplitDim(tensor.spec()) < 0;
  const bool per_expert = tensor.num_experts() > 0;
  if ((whole_under_tp && layout.tp_rank != 0) || (!per_expert && layout.ep_rank != 0)) {
    return std::nullopt;
  }
  return RankBox(tensor, layout.tp_rank, layout.tp_size, layout.ep_rank, layout.ep_size);
}

int64_t RowMajorOffset(absl::Span<const int64_t> shape, absl::Span<const int64_t> index) {
  int64_t offset = 0;
  for (size_t d = 0; d < shape.size(); ++d) offset = offset * shape[d] + index[d];
  return offset;
}

// Copies `box` of the row-major tensor `src` (`src_shape`) into row-major `dst` (`dst_shape`)
// with the box's first element at `dst_origin`, one innermost row at a time.
void CopyBox(const char* src, absl::Span<const int64_t> src_shape, const TensorBox& box, char* dst,
             absl::Span<const int64_t> dst_shape, absl::Span<const int64_t> dst_origin,
             int64_t element_size) {
  const int rank = static_cast<int>(box.size.size());
  std::vector<int64_t> position(rank, 0), src_index(rank), dst_index(rank);
  while (true) {
    for (int d = 0; d < rank; ++d) {
      src_index[d] = box.begin[d] + position[d];
      dst_index[d] = dst_origin[d] + position[d];
    }
    std::memcpy(dst + RowMajorOffset(dst_shape, dst_index) * element_size,
                src + RowMajorOffset(src_shape, src_index) * element_size,
                box.size[rank - 1] * element_size);
    int d = rank - 2;
    while (d >= 0 && ++position[d] == box.size[d]) position[d--] = 0;
    if (d < 0) return;
  }
}

// Appends a piece holding `box` of `gate` and, when `up` is set, the same box of `up` right
// after it along canonical dim 0 (fused_dim 0).
void AppendPiece(const weightstore::v1::CanonicalTensor& gate, const std::string& gate_bytes,
                 const std::string* up_bytes, const TensorBox& box, weightstore::v1::Shard& shard,
                 std::string& shard_bytes) {
  const int64_t element_size = ElementSize(gate.spec().dtype());
  std::vector<int64_t> local_shape = box.size;
  if (up_bytes != nullptr) local_shape[1] *= 2;
  const size_t offset = shard_bytes.size();
  const int64_t length = ElementCount(local_shape) * element_size;
  shard_bytes.resize(offset + length);
  const std::vector<int64_t> shape = ExtendedShape(gate);
  std::vector<int64_t> origin(local_shape.size(), 0);
  CopyBox(gate_bytes.data(), shape, box, shard_bytes.data() + offset, local_shape, origin,
          element_size);
  if (up_bytes != nullptr) {
    origin[1] = box.size[1];
    CopyBox(up_bytes->data(), shape, box, shard_bytes.data() + offset, local_shape, origin,
            element_size);
  }
  weightstore::v1::ShardPiece& piece = *shard.add_pieces();
  piece.set_tensor_name(gate.spec().name());
  if (gate.num_experts() > 0) {
    piece.set_expert_begin(static_cast<int32_t>(box.begin[0]));
    piece.set_expert_end(static_cast<int32_t>(box.begin[0] + box.size[0]));
  }
  piece.set_fused_gate_up(up_bytes != nullptr);
  for (size_t d = 1; d < box.size.size(); ++d) {
    weightstore::v1::DimSlice& slice = *piece.add_slice();
    slice.set_offset(box.begin[d]);
    slice.set_size(box.size[d]);
  }
  piece.set_byte_offset(offset);
  piece.set_byte_length(length);
}

absl::StatusOr<const std::string*> TensorBytes(
    const weightstore::v1::CanonicalTensor& tensor,
    const absl::flat_hash_map<std::string, std::string>& canonical) {
  const auto it = canonical.find(tensor.spec().name());
  const int64_t expected = ElementCount(ExtendedShape(tensor)) * ElementSize(tensor.spec().dtype());
  if (it == canonical.end() || static_cast<int64_t>(it->second.size()) != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", tensor.spec().name(), "': expected ", expected, " bytes, got ",
                     it == canonical.end() ? "none" : absl::StrCat(it->second.size())));
  }
  return &it->second;
}

// gate_proj name -> up_proj tensor that the producer fuses into the gate piece.
absl::flat_hash_map<std::string, const weightstore::v1::CanonicalTensor*> FusedPartners(
    const std::vector<weightstore::v1::CanonicalTensor>& tensors) {
  absl::flat_hash_map<std::string, const weightstore::v1::CanonicalTensor*> by_name, partners;
  for (const weightstore::v1::CanonicalTensor& tensor : tensors)
    by_name[tensor.spec().name()] = &tensor;
  for (const weightstore::v1::CanonicalTensor& tensor : tensors) {
    const std::optional<std::string> up_name = UpProjName(tensor.spec().name());
    if (!up_name.has_value()) continue;
    const auto up = by_name.find(*up_name);
    if (up != by_name.end() && CanFuseGateUp(tensor, *up->second)) {
      partners[tensor.spec().name()] = up->second;
    }
  }
  return partners;
}

}  // namespace

int64_t ElementSize(type::v1::Dtype dtype) {
  switch (dtype) {
    case type::v1::DTYPE_F32:
    case type::v1::DTYPE_I32:
      return 4;
    case type::v1::DTYPE_BF16:
    case type::v1::DTYPE_F16:
    case type::v1::DTYPE_I16:
      return 2;
    default:
      return 0;
  }
}

type::v1::LoraConfig WithLoraDefaults(type::v1::LoraConfig lora) {
  if (lora.expert_layout() == type::v1::EXPERT_LAYOUT_UNSPECIFIED) {
    lora.set_expert_layout(type::v1::EXPERT_LAYOUT_PER_EXPERT);
  }
  if (lora.alpha() == 0) lora.set_alpha(static_cast<float>(lora.rank()));
  if (lora.target_modules().empty()) {
    for (absl::string_view module : kTargetModules) lora.add_target_modules(std::string(module));
  }
  return lora;
}

absl::Status ValidateLoraConfig(const type::v1::LoraConfig& lora) {
  if (lora.rank() < 1 || lora.rank() > kMaxRank) {
    return absl::InvalidArgumentError(
        absl::StrCat("lora.rank: ", lora.rank(), " not in 1..", kMaxRank));
  }
  if (!std::isfinite(lora.alpha()) || lora.alpha() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("lora.alpha: ", lora.alpha(), " < 0 or not finite"));
  }
  if (!(lora.dropout() >= 0 && lora.dropout() < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lora.dropout: ", lora.dropout(), " not in [0, 1)"));
  }
  if (lora.expert_layout() == type::v1::EXPERT_LAYOUT_UNSPECIFIED ||
      !type::v1::ExpertLayout_IsValid(lora.expert_layout())) {
    return absl::InvalidArgumentError(
        absl::StrCat("lora.expert_layout: ", lora.expert_layout(), " is not a layout"));
  }
  return ValidateTargetModules(lora);
}

bool ModelShape::IsDenseLayer(int layer) const {
  return layer < num_dense_layers || std::find(other_dense_layers.begin(), other_dense_layers.end(),
                                               layer) != other_dense_layers.end();
}

std::vector<int64_t> ExtendedShape(const weightstore::v1::CanonicalTensor& tensor) {
  std::vector<int64_t> shape = {std::max(tensor.num_experts(), 1)};
  shape.insert(shape.end(), tensor.spec().shape().begin(), tensor.spec().shape().end());
  return shape;
}

absl::StatusOr<TensorBox> RankBox(const weightstore::v1::CanonicalTensor& tensor, int tp_rank,
                                  int tp_size, int ep_rank, int ep_size) {
  TensorBox box{std::vector<int64_t>(tensor.spec().shape_size() + 1, 0), ExtendedShape(tensor)};
  if (const int split = TpSplitDim(tensor.spec()); split >= 0) {
    absl::Status status = SplitEvenly(tensor, split + 1, tp_size, tp_rank, box);
    if (!status.ok()) return status;
  }
  if (tensor.num_experts() > 0) {
    absl::Status status = SplitEvenly(tensor, 0, ep_size, ep_rank, box);
    if (!status.ok()) return status;
  }
  return box;
}

int TpSplitDim(const type::v1::TensorSpec& spec) {
  absl::string_view name = spec.name();
  const bool is_a = absl::ConsumeSuffix(&name, ".lora_A.weight");
  if (!is_a && !absl::ConsumeSuffix(&name, ".lora_B.weight")) return -1;
  const absl::string_view projection = name.substr(name.rfind('.') + 1);
  int dim = -1;
  if (IsColumnParallel(projection) && !is_a) dim = 0;
  if (IsRowParallel(projection) && is_a) dim = 1;
  return dim < spec.shape_size() ? dim : -1;
}

bool IsRoutedExpertTensor(absl::string_view name) {
  return absl::StrContains(name, ".mlp.experts.");
}

std::optional<std::string> UpProjName(absl::string_view gate_name) {
  if (!absl::StrContains(gate_name, "gate_proj")) return std::nullopt;
  return absl::StrReplaceAll(gate_name, {{"gate_proj", "up_proj"}});
}

bool CanFuseGateUp(const weightstore::v1::CanonicalTensor& gate,
                   const weightstore::v1::CanonicalTensor& up) {
  return gate.spec().dtype() == up.spec().dtype() && gate.num_experts() == up.num_experts() &&
         gate.spec().shape_size() > 0 &&
         std::equal(gate.spec().shape().begin(), gate.spec().shape().end(),
                    up.spec().shape().begin(), up.spec().shape().end());
}

absl::StatusOr<std::vector<weightstore::v1::CanonicalTensor>> CanonicalTensorsFor(
    const ModelShape& model, const type::v1::LoraConfig& lora, type::v1::Dtype dtype) {
  if (absl::Status status = ValidateLoraConfig(lora); !status.ok()) return status;
  if (absl::Status status = ValidateModelShape(model); !status.ok()) return status;
  if (ElementSize(dtype) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("dtype: ", dtype, " is not a dtype"));
  }
  absl::flat_hash_set<std::string> targets(lora.target_modules().begin(),
                                           lora.target_modules().end());
  if (targets.empty()) targets.insert(std::begin(kTargetModules), std::end(kTargetModules));
  std::vector<weightstore::v1::CanonicalTensor> tensors;
  for (int layer = 0; layer < model.num_layers; ++layer) {
    AddLayer(model, lora, dtype, layer, targets, tensors);
  }
  std::sort(tensors.begin(), tensors.end(),
            [](const auto& a, const auto& b) { return a.spec().name() < b.spec().name(); });
  return tensors;
}

absl::StatusOr<std::pair<weightstore::v1::Shard, std::string>> BuildProducerShard(
    const std::vector<weightstore::v1::CanonicalTensor>& tensors,
    const absl::flat_hash_map<std::string, std::string>& canonical, const ProducerLayout& layout,
    int producer_rank) {
  if (absl::Status status = ValidateProducerLayout(layout, producer_rank); !status.ok()) {
    return status;
  }
  absl::flat_hash_map<std::string, const weightstore::v1::CanonicalTensor*> partners;
  if (layout.fuse_gate_up) partners = FusedPartners(tensors);
  absl::flat_hash_set<std::string> fused_ups;
  for (const auto& [gate, up] : partners) fused_ups.insert(up->spec().name());
  weightstore::v1::Shard shard;
  shard.set_producer_rank(producer_rank);
  std::string bytes;
  for (const weightstore::v1::CanonicalTensor& tensor : tensors) {
    if (fused_ups.contains(tensor.spec().name())) continue;
    absl::StatusOr<std::optional<TensorBox>> box = ProducerBox(tensor, layout);
    if (!box.ok()) return box.status();
    if (!box->has_value()) continue;
    absl::StatusOr<const std::string*> gate_bytes = TensorBytes(tensor, canonical);
    if (!gate_bytes.ok()) return gate_bytes.status();
    const std::string* up_bytes = nullptr;
    if (const auto partner = partners.find(tensor.spec().name()); partner != partners.end()) {
      absl::StatusOr<const std::string*> found = TensorBytes(*partner->second, canonical);
      if (!found.ok()) return found.status();
      up_bytes = *found;
    }
    TensorBox part = **box;
    const bool one_piece_per_expert = tensor.num_experts() > 0 && !layout.stack_experts;
    const int64_t experts = part.size[0];
    if (one_piece_per_expert) part.size[0] = 1;
    for (int64_t e = 0; e < (one_piece_per_expert ? experts : 1); ++e) {
      AppendPiece(tensor, **gate_bytes, up_bytes, part, shard, bytes);
      ++part.begin[0];
    }
  }
  shard.set_byte_size(bytes.size());
  shard.set_xxh3_64(Xxh3Checksum(bytes));
  return std::pair{std::move(shard), std::move(bytes)};
}

}  // namespace tandem::transfer
