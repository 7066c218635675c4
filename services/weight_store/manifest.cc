#include "services/weight_store/manifest.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/identifier.h"
#include "common/status.h"
#include "common/string_limits.h"
#include "transfer/lora_layout.h"

namespace tandem::weight_store {
namespace {

constexpr int kMaxTensors = 1'000'000;
constexpr int kMaxDims = 8;
constexpr int kMaxExperts = 32767;
constexpr int kMaxShards = 65536;
constexpr size_t kMaxManifestBytes = size_t{64} << 20;
constexpr uint64_t kMaxShardBytes = uint64_t{1} << 40;
// All shards together hold at most this much, so no larger tensor can be covered. The bound
// also keeps every element count and byte size below in uint64 range.
constexpr uint64_t kMaxTensorBytes = kMaxShards * kMaxShardBytes;

// INVALID_ARGUMENT about the field at `path` (from the request root: "manifest.shards[2]...").
template <typename... Parts>
absl::Status Invalid(absl::string_view path, const Parts&... parts) {
  return InvalidField(path, absl::StrCat(parts...));
}

// A canonical tensor with its extended index space: [experts] ++ shape, where a tensor that is
// not per expert has one pseudo expert.
struct TensorInfo {
  const weightstore::v1::CanonicalTensor* tensor = nullptr;
  std::vector<int64_t> shape;
  uint64_t elements = 0;
};

// The index box one piece covers in a tensor's extended index space, [begin, end).
struct CoveredBox {
  std::vector<int64_t> begin;
  std::vector<int64_t> end;
  int shard = 0;
  int piece = 0;
};

struct Tensors {
  std::vector<TensorInfo> infos;
  absl::flat_hash_map<absl::string_view, int> index_by_name;
};

// `path` is the CanonicalTensor's ("manifest.tensors[3]").
absl::Status ValidateShape(const weightstore::v1::CanonicalTensor& tensor, TensorInfo& info,
                           absl::string_view path) {
  const type::v1::TensorSpec& spec = tensor.spec();
  const std::string shape_path = FieldPath(path, "spec.shape");
  if (spec.shape_size() > kMaxDims) {
    return Invalid(shape_path, spec.shape_size(), " dims > ", kMaxDims);
  }
  for (int d = 0; d < spec.shape_size(); ++d) {
    if (spec.shape(d) < 1) {
      return Invalid(IndexPath(shape_path, d), "shape[", d, "] = ", spec.shape(d), " < 1");
    }
  }
  info.shape.push_back(std::max(tensor.num_experts(), 1));
  info.shape.insert(info.shape.end(), spec.shape().begin(), spec.shape().end());
  const uint64_t max_elements = kMaxTensorBytes / transfer::ElementSize(spec.dtype());
  uint64_t elements = 1;
  for (int64_t dim : info.shape) {
    if (static_cast<uint64_t>(dim) > max_elements / elements) {
      return Invalid(shape_path, "more than ", kMaxTensorBytes, " bytes");
    }
    elements *= dim;
  }
  info.elements = elements;
  return absl::OkStatus();
}

absl::Status ValidateExperts(const weightstore::v1::CanonicalTensor& tensor,
                             absl::string_view path) {
  const absl::string_view name = tensor.spec().name();
  const std::string experts_path = FieldPath(path, "num_experts");
  const size_t placeholder = name.find(transfer::kExpertPlaceholder);
  if (placeholder == absl::string_view::npos) {
    if (tensor.num_experts() != 0) {
      return Invalid(experts_path, "num_experts ", tensor.num_experts(), " != 0");
    }
    return absl::OkStatus();
  }
  if (name.find(transfer::kExpertPlaceholder, placeholder + 1) != absl::string_view::npos) {
    return Invalid(FieldPath(path, "spec.name"), "'", transfer::kExpertPlaceholder,
                   "' more than once");
  }
  if (tensor.num_experts() < 1 || tensor.num_experts() > kMaxExperts) {
    return Invalid(experts_path, "num_experts ", tensor.num_experts(), " not in 1..", kMaxExperts);
  }
  return absl::OkStatus();
}

absl::Status ValidateTensor(const weightstore::v1::CanonicalTensor& tensor, TensorInfo& info,
                            absl::string_view path) {
  const type::v1::TensorSpec& spec = tensor.spec();
  if (spec.name().empty() || spec.name().size() > kMaxTensorNameBytes) {
    return Invalid(FieldPath(path, "spec.name"), "name of ", spec.name().size(),
                   " bytes not in 1..", kMaxTensorNameBytes);
  }
  if (transfer::ElementSize(spec.dtype()) == 0) {
    return Invalid(FieldPath(path, "spec.dtype"), "dtype ", spec.dtype(), " is not a dtype");
  }
  if (absl::Status status = ValidateExperts(tensor, path); !status.ok()) return status;
  return ValidateShape(tensor, info, path);
}

absl::Status ValidateTensors(const weightstore::v1::Manifest& manifest, Tensors& tensors,
                             absl::string_view path) {
  const std::string tensors_path = FieldPath(path, "tensors");
  if (manifest.tensors_size() < 1 || manifest.tensors_size() > kMaxTensors) {
    return Invalid(tensors_path, "tensors: ", manifest.tensors_size(), " entries not in 1..",
                   kMaxTensors);
  }
  tensors.infos.resize(manifest.tensors_size());
  for (int i = 0; i < manifest.tensors_size(); ++i) {
    const weightstore::v1::CanonicalTensor& tensor = manifest.tensors(i);
    TensorInfo& info = tensors.infos[i];
    info.tensor = &tensor;
    const std::string tensor_path = IndexPath(tensors_path, i);
    if (absl::Status status = ValidateTensor(tensor, info, tensor_path); !status.ok()) {
      return Annotate(status, absl::StrCat("tensor ", i, " '", tensor.spec().name(), "': "));
    }
    if (!tensors.index_by_name.emplace(tensor.spec().name(), i).second) {
      return Invalid(FieldPath(tensor_path, "spec.name"), "tensor ", i, ": duplicate name '",
                     tensor.spec().name(), "'");
    }
  }
  return absl::OkStatus();
}

// `path` is the ShardPiece's ("manifest.shards[1].pieces[4]").
absl::Status ValidateExpertRange(const weightstore::v1::ShardPiece& piece, const TensorInfo& info,
                                 absl::string_view path) {
  const int experts = info.tensor->num_experts();
  if (experts == 0 && (piece.expert_begin() != 0 || piece.expert_end() != 0)) {
    return Invalid(FieldPath(path, piece.expert_begin() != 0 ? "expert_begin" : "expert_end"),
                   "expert range [", piece.expert_begin(), ", ", piece.expert_end(),
                   ") on a tensor without experts");
  }
  if (experts > 0 && (piece.expert_begin() < 0 || piece.expert_begin() >= piece.expert_end() ||
                      piece.expert_end() > experts)) {
    const bool bad_begin = piece.expert_begin() < 0 || piece.expert_begin() >= experts;
    return Invalid(FieldPath(path, bad_begin ? "expert_begin" : "expert_end"), "expert range [",
                   piece.expert_begin(), ", ", piece.expert_end(), ") not within [0, ", experts,
                   ")");
  }
  return absl::OkStatus();
}

// The up_proj tensor of a fused piece.
absl::StatusOr<int> FusedPartner(const weightstore::v1::ShardPiece& piece, const TensorInfo& gate,
                                 const Tensors& tensors, absl::string_view path) {
  const std::string fused_path = FieldPath(path, "fused_gate_up");
  const std::optional<std::string> up_name = transfer::UpProjName(piece.tensor_name());
  if (!up_name.has_value()) {
    return Invalid(fused_path, "fused_gate_up on a tensor without 'gate_proj'");
  }
  const auto up = tensors.index_by_name.find(*up_name);
  if (up == tensors.index_by_name.end()) {
    return Invalid(fused_path, "fused_gate_up partner '", *up_name, "' missing");
  }
  if (!transfer::CanFuseGateUp(*gate.tensor, *tensors.infos[up->second].tensor)) {
    return Invalid(fused_path, "fused_gate_up partner '", *up_name,
                   "' differs in dtype, shape or experts");
  }
  if (piece.fused_dim() < 0 || piece.fused_dim() >= gate.tensor->spec().shape_size()) {
    return Invalid(FieldPath(path, "fused_dim"), "fused_dim ", piece.fused_dim(), " not in [0, ",
                   gate.tensor->spec().shape_size(), ")");
  }
  return up->second;
}

// The box the piece covers, after checking its slice against the tensor's shape.
absl::StatusOr<CoveredBox> SliceBox(const weightstore::v1::ShardPiece& piece,
                                    const TensorInfo& info, absl::string_view path) {
  const std::string slice_path = FieldPath(path, "slice");
  if (piece.slice_size() + 1 != static_cast<int>(info.shape.size())) {
    return Invalid(slice_path, piece.slice_size(), " slice entries for ", info.shape.size() - 1,
                   " dims");
  }
  CoveredBox box;
  const bool per_expert = info.tensor->num_experts() > 0;
  box.begin.push_back(per_expert ? piece.expert_begin() : 0);
  box.end.push_back(per_expert ? piece.expert_end() : 1);
  for (int d = 0; d < piece.slice_size(); ++d) {
    const weightstore::v1::DimSlice& slice = piece.slice(d);
    const int64_t dim = info.shape[d + 1];
    if (slice.offset() < 0 || slice.size() < 1 || slice.offset() > dim - slice.size()) {
      // offset + size <= the dimension is the rule of size (DimSlice).
      return Invalid(FieldPath(IndexPath(slice_path, d), slice.offset() < 0 ? "offset" : "size"),
                     "slice[", d, "] offset ", slice.offset(), " size ", slice.size(),
                     " not within dim ", dim);
    }
    box.begin.push_back(slice.offset());
    box.end.push_back(slice.offset() + slice.size());
  }
  return box;
}

uint64_t BoxElements(const CoveredBox& box) {
  uint64_t elements = 1;
  for (size_t d = 0; d < box.begin.size(); ++d) elements *= box.end[d] - box.begin[d];
  return elements;
}

absl::Status ValidateBytes(const weightstore::v1::ShardPiece& piece,
                           const weightstore::v1::Shard& shard, const TensorInfo& info,
                           const CoveredBox& box, absl::string_view path) {
  // Fits: the box lies within a tensor of at most kMaxTensorBytes.
  const uint64_t expected = BoxElements(box) * (piece.fused_gate_up() ? 2 : 1) *
                            transfer::ElementSize(info.tensor->spec().dtype());
  if (piece.byte_length() != expected) {
    return Invalid(FieldPath(path, "byte_length"), "byte_length ", piece.byte_length(),
                   " != ", expected, " of the slice");
  }
  if (piece.byte_offset() > shard.byte_size() ||
      piece.byte_length() > shard.byte_size() - piece.byte_offset()) {
    return Invalid(
        FieldPath(path, piece.byte_offset() > shard.byte_size() ? "byte_offset" : "byte_length"),
        "bytes [", piece.byte_offset(), ", +", piece.byte_length(), ") beyond shard byte_size ",
        shard.byte_size());
  }
  return absl::OkStatus();
}

// Checks one piece and adds the boxes it covers (of gate and up when fused) to `coverage`.
// `path` is the piece's.
absl::Status ValidatePiece(const weightstore::v1::Shard& shard, int shard_index, int piece_index,
                           const Tensors& tensors, std::vector<std::vector<CoveredBox>>& coverage,
                           absl::string_view path) {
  const weightstore::v1::ShardPiece& piece = shard.pieces(piece_index);
  const auto found = tensors.index_by_name.find(piece.tensor_name());
  if (found == tensors.index_by_name.end()) {
    return Invalid(FieldPath(path, "tensor_name"), "unknown tensor");
  }
  const TensorInfo& info = tensors.infos[found->second];
  if (absl::Status status = ValidateExpertRange(piece, info, path); !status.ok()) return status;
  std::optional<int> up;
  if (piece.fused_gate_up()) {
    absl::StatusOr<int> partner = FusedPartner(piece, info, tensors, path);
    if (!partner.ok()) return partner.status();
    up = *partner;
  }
  absl::StatusOr<CoveredBox> box = SliceBox(piece, info, path);
  if (!box.ok()) return box.status();
  if (absl::Status status = ValidateBytes(piece, shard, info, *box, path); !status.ok()) {
    return status;
  }
  box->shard = shard_index;
  box->piece = piece_index;
  if (up.has_value()) coverage[*up].push_back(*box);
  coverage[found->second].push_back(*std::move(box));
  return absl::OkStatus();
}

// `path` is the Shard's.
absl::Status ValidatePieceBytesDisjoint(const weightstore::v1::Shard& shard,
                                        absl::string_view path) {
  std::vector<int> order(shard.pieces_size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return shard.pieces(a).byte_offset() < shard.pieces(b).byte_offset();
  });
  for (size_t i = 1; i < order.size(); ++i) {
    const weightstore::v1::ShardPiece& previous = shard.pieces(order[i - 1]);
    if (previous.byte_offset() + previous.byte_length() > shard.pieces(order[i]).byte_offset()) {
      return Invalid(FieldPath(IndexPath(FieldPath(path, "pieces"), order[i]), "byte_offset"),
                     "pieces ", order[i - 1], " and ", order[i], " overlap in bytes");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateShard(const weightstore::v1::Shard& shard, int shard_index,
                           const Tensors& tensors, std::vector<std::vector<CoveredBox>>& coverage,
                           absl::string_view path) {
  if (shard.producer_rank() < 0) {
    return Invalid(FieldPath(path, "producer_rank"), "producer_rank ", shard.producer_rank(),
                   " < 0");
  }
  if (shard.byte_size() < 1 || shard.byte_size() > kMaxShardBytes) {
    return Invalid(FieldPath(path, "byte_size"), "byte_size ", shard.byte_size(), " not in 1..",
                   kMaxShardBytes);
  }
  const std::string pieces_path = FieldPath(path, "pieces");
  if (shard.pieces_size() == 0) return Invalid(pieces_path, "no pieces");
  for (int p = 0; p < shard.pieces_size(); ++p) {
    if (absl::Status status =
            ValidatePiece(shard, shard_index, p, tensors, coverage, IndexPath(pieces_path, p));
        !status.ok()) {
      return Annotate(
          status, absl::StrCat("piece ", p, " (tensor '", shard.pieces(p).tensor_name(), "'): "));
    }
  }
  return ValidatePieceBytesDisjoint(shard, path);
}

bool Intersect(const CoveredBox& a, const CoveredBox& b) {
  for (size_t d = 0; d < a.begin.size(); ++d) {
    if (a.end[d] <= b.begin[d] || b.end[d] <= a.begin[d]) return false;
  }
  return true;
}

// Exactly-once: no two boxes intersect and, since all lie within the tensor, their sizes then
// add up to the tensor's element count only if nothing is left uncovered. An overlap names the
// later piece of the two (under `path`, the manifest's), missing coverage the tensor
// (`tensor_path`).
absl::Status ValidateCoverage(const TensorInfo& info, std::vector<CoveredBox>& boxes,
                              absl::string_view path, absl::string_view tensor_path) {
  // Sorted by the expert dimension so a box is only compared with those that start before it
  // ends there, which keeps per-expert pieces of many experts far from quadratic.
  std::sort(boxes.begin(), boxes.end(),
            [](const CoveredBox& a, const CoveredBox& b) { return a.begin[0] < b.begin[0]; });
  uint64_t covered = 0;
  for (size_t i = 0; i < boxes.size(); ++i) {
    for (size_t j = i + 1; j < boxes.size() && boxes[j].begin[0] < boxes[i].end[0]; ++j) {
      if (Intersect(boxes[i], boxes[j])) {
        const CoveredBox& later =
            std::tie(boxes[i].shard, boxes[i].piece) < std::tie(boxes[j].shard, boxes[j].piece)
                ? boxes[j]
                : boxes[i];
        return Invalid(
            IndexPath(FieldPath(IndexPath(FieldPath(path, "shards"), later.shard), "pieces"),
                      later.piece),
            "shard ", boxes[i].shard, " piece ", boxes[i].piece, " and shard ", boxes[j].shard,
            " piece ", boxes[j].piece, " overlap");
      }
    }
    covered += BoxElements(boxes[i]);
  }
  if (covered != info.elements) {
    return Invalid(tensor_path, "pieces cover ", covered, " of ", info.elements, " elements");
  }
  return absl::OkStatus();
}

// The LoRA config's error as an error about its field under `path` (the manifest's): the
// message starts with the field ("lora.rank: 0 not in 1..1024"), and a refused target module is
// named by its index.
absl::Status LoraFieldError(const weightstore::v1::Manifest& manifest, const absl::Status& status,
                            absl::string_view path) {
  const absl::string_view message = status.message();
  const size_t colon = message.find(':');
  absl::string_view field = colon == absl::string_view::npos ? "" : message.substr(0, colon);
  if (!absl::StartsWith(field, "lora.") ||
      field.find_first_not_of("abcdefghijklmnopqrstuvwxyz_.") != absl::string_view::npos) {
    field = "lora";
  }
  if (field == "lora.target_modules") {
    // The first module that is no LoRA target or repeats one before it.
    type::v1::LoraConfig one;
    one.set_rank(1);
    one.set_expert_layout(type::v1::EXPERT_LAYOUT_PER_EXPERT);
    one.add_target_modules();
    absl::flat_hash_set<absl::string_view> seen;
    const auto& modules = manifest.lora().target_modules();
    for (int i = 0; i < modules.size(); ++i) {
      one.set_target_modules(0, modules[i]);
      if (!transfer::ValidateLoraConfig(one).ok() || !seen.insert(modules[i]).second) {
        return WithFieldPath(status, IndexPath(FieldPath(path, field), i));
      }
    }
  }
  return WithFieldPath(status, FieldPath(path, field));
}

absl::Status ValidateContents(const weightstore::v1::Manifest& manifest, absl::string_view path) {
  if (absl::Status status = transfer::ValidateLoraConfig(manifest.lora()); !status.ok()) {
    return LoraFieldError(manifest, status, path);
  }
  Tensors tensors;
  if (absl::Status status = ValidateTensors(manifest, tensors, path); !status.ok()) return status;
  const std::string shards_path = FieldPath(path, "shards");
  if (manifest.shards_size() < 1 || manifest.shards_size() > kMaxShards) {
    return Invalid(shards_path, "shards: ", manifest.shards_size(), " entries not in 1..",
                   kMaxShards);
  }
  std::vector<std::vector<CoveredBox>> coverage(tensors.infos.size());
  for (int s = 0; s < manifest.shards_size(); ++s) {
    if (absl::Status status =
            ValidateShard(manifest.shards(s), s, tensors, coverage, IndexPath(shards_path, s));
        !status.ok()) {
      return Annotate(status, absl::StrCat("shard ", s, ": "));
    }
  }
  for (size_t t = 0; t < tensors.infos.size(); ++t) {
    if (absl::Status status =
            ValidateCoverage(tensors.infos[t], coverage[t], path,
                             IndexPath(FieldPath(path, "tensors"), static_cast<int64_t>(t)));
        !status.ok()) {
      return Annotate(status,
                      absl::StrCat("tensor '", tensors.infos[t].tensor->spec().name(), "': "));
    }
  }
  return absl::OkStatus();
}

// base_model and labels are stored with every version and sent with every manifest.
absl::Status CheckStringSizes(const weightstore::v1::Manifest& manifest, absl::string_view path) {
  if (absl::Status status = CheckMaxBytes("base_model", manifest.base_model(), kMaxPathBytes);
      !status.ok()) {
    return WithFieldPath(status, FieldPath(path, "base_model"));
  }
  const std::string labels_path = FieldPath(path, "labels");
  if (manifest.labels_size() > kMaxLabels) {
    return Invalid(labels_path, "labels has ", manifest.labels_size(), " entries; at most ",
                   kMaxLabels);
  }
  for (const auto& [key, value] : manifest.labels()) {
    absl::Status status = CheckMaxBytes("labels key", key, kMaxNameBytes);
    if (status.ok())
      status = CheckMaxBytes(absl::StrCat("labels[", key, "]"), value, kMaxTextBytes);
    if (!status.ok()) return WithFieldPath(status, KeyPath(labels_path, key));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateManifest(const weightstore::v1::Manifest& manifest, absl::string_view path) {
  if (absl::Status status = ValidateIdentifier("adapter_name", manifest.adapter_name());
      !status.ok()) {
    return WithFieldPath(status, FieldPath(path, "adapter_name"));
  }
  if (manifest.version() < 1) {
    return Invalid(FieldPath(path, "version"), manifest.adapter_name(), ": version ",
                   manifest.version(), " < 1");
  }
  const std::string name = absl::StrCat(manifest.adapter_name(), "@", manifest.version(), ": ");
  if (const size_t encoded = manifest.ByteSizeLong(); encoded > kMaxManifestBytes) {
    return Invalid(path, name, "manifest encodes to ", encoded, " bytes; at most 64 MiB");
  }
  if (absl::Status status = CheckStringSizes(manifest, path); !status.ok()) {
    return Annotate(status, name);
  }
  if (absl::Status status = ValidateContents(manifest, path); !status.ok()) {
    return Annotate(status, name);
  }
  return absl::OkStatus();
}

absl::Status ValidateVersionOf(absl::string_view adapter_name, int64_t version) {
  if (absl::Status status = ValidateIdentifier("adapter_name", adapter_name); !status.ok()) {
    return status;
  }
  if (version < 1) {
    return InvalidField("version", absl::StrCat("version is ", version, "; must be >= 1"));
  }
  return absl::OkStatus();
}

}  // namespace tandem::weight_store
