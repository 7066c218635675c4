#include "services/weight_store/reshard.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/types/span.h"
#include "common/sha256.h"
#include "common/status.h"
#include "common/string_limits.h"
#include "services/weight_store/manifest.h"
#include "transfer/lora_layout.h"

namespace tandem::weight_store {
namespace {

constexpr int kMaxTpSize = 1024;

// TargetLayout with defaults resolved.
struct Consumer {
  int tp_rank = 0;
  int tp_size = 1;
  int ep_rank = 0;
  int ep_size = 1;
  int expert_tp_rank = 0;
  int expert_tp_size = 1;
  bool fuse_gate_up = false;
  bool stack_experts = false;
};

// INVALID_ARGUMENT about the field at `path`. Every request that reaches PlanReads holds the
// layout at "target" and the names at "tensor_names"; a manifest is at "manifest".
template <typename... Parts>
absl::Status Invalid(absl::string_view path, const Parts&... parts) {
  return InvalidField(path, absl::StrCat(parts...));
}

absl::Status CheckRank(absl::string_view field, int rank, int size, int max_size) {
  if (size < 1 || size > max_size || rank < 0 || rank >= size) {
    const bool bad_size = size < 1 || size > max_size;
    return Invalid(absl::StrCat("target.", field, bad_size ? "_size" : "_rank"), "target.", field,
                   ": rank ", rank, " of size ", size, " not 0 <= rank < size <= ", max_size);
  }
  return absl::OkStatus();
}

absl::Status CheckEnums(const weightstore::v1::TargetLayout& target) {
  if (!weightstore::v1::TensorNaming_IsValid(target.naming())) {
    return Invalid("target.naming", "target.naming: ", target.naming(), " is not a naming");
  }
  const type::v1::Dtype dtype = target.dtype();
  if (dtype != type::v1::DTYPE_UNSPECIFIED && dtype != type::v1::DTYPE_F32 &&
      dtype != type::v1::DTYPE_BF16 && dtype != type::v1::DTYPE_F16) {
    return Invalid("target.dtype", "target.dtype: ", dtype, " is not F32, BF16 or F16");
  }
  return absl::OkStatus();
}

absl::StatusOr<Consumer> ResolveLayout(const weightstore::v1::TargetLayout& target) {
  // An unset size means 1.
  auto size = [](int value) { return value == 0 ? 1 : value; };
  const Consumer consumer{
      .tp_rank = target.tp_rank(),
      .tp_size = size(target.tp_size()),
      .ep_rank = target.ep_rank(),
      .ep_size = size(target.ep_size()),
      .expert_tp_rank = target.expert_tp_rank(),
      .expert_tp_size = size(target.expert_tp_size()),
      .fuse_gate_up = target.fuse_gate_up(),
      // The embedded engine stores experts stacked.
      .stack_experts = target.stack_experts() ||
                       target.naming() == weightstore::v1::TENSOR_NAMING_ENGINE_NATIVE};
  constexpr int kUnbounded = std::numeric_limits<int>::max();
  for (absl::Status status :
       {CheckRank("tp", consumer.tp_rank, consumer.tp_size, kMaxTpSize),
        CheckRank("ep", consumer.ep_rank, consumer.ep_size, kUnbounded),
        CheckRank("expert_tp", consumer.expert_tp_rank, consumer.expert_tp_size, kUnbounded),
        CheckEnums(target)}) {
    if (!status.ok()) return status;
  }
  return consumer;
}

// A box of one canonical tensor placed in a row-major buffer (a shard piece or a target
// tensor), all in the tensor's extended index space (see TensorBox).
struct Placement {
  int tensor = 0;
  transfer::TensorBox box;
  std::vector<int64_t> buffer_shape;
  // Where box.begin lies in the buffer.
  std::vector<int64_t> origin;
  // Source buffers only: the piece's shard and byte offset there.
  int shard = 0;
  uint64_t buffer_offset = 0;
};

// The placements of `box` of `gate` and, when fused, of the same box of `up` right after it
// along extended dim `fused_dim` of one buffer.
std::vector<Placement> PlaceBox(int gate, std::optional<int> up, const transfer::TensorBox& box,
                                int fused_dim) {
  Placement placement{gate, box, box.size, std::vector<int64_t>(box.size.size(), 0)};
  if (!up.has_value()) return {placement};
  placement.buffer_shape[fused_dim] *= 2;
  Placement up_placement = placement;
  up_placement.tensor = *up;
  up_placement.origin[fused_dim] = box.size[fused_dim];
  return {placement, up_placement};
}

absl::flat_hash_map<absl::string_view, int> IndexByName(const weightstore::v1::Manifest& manifest) {
  absl::flat_hash_map<absl::string_view, int> index_by_name;
  for (int t = 0; t < manifest.tensors_size(); ++t) {
    index_by_name[manifest.tensors(t).spec().name()] = t;
  }
  return index_by_name;
}

transfer::TensorBox PieceBox(const weightstore::v1::ShardPiece& piece,
                             const weightstore::v1::CanonicalTensor& tensor) {
  const bool per_expert = tensor.num_experts() > 0;
  transfer::TensorBox box{{per_expert ? piece.expert_begin() : 0},
                          {per_expert ? piece.expert_end() - piece.expert_begin() : 1}};
  for (const weightstore::v1::DimSlice& slice : piece.slice()) {
    box.begin.push_back(slice.offset());
    box.size.push_back(slice.size());
  }
  return box;
}

// Every piece's placements, by tensor index.
std::vector<std::vector<Placement>> SourcePlacements(const weightstore::v1::Manifest& manifest) {
  const absl::flat_hash_map<absl::string_view, int> index_by_name = IndexByName(manifest);
  std::vector<std::vector<Placement>> sources(manifest.tensors_size());
  for (int s = 0; s < manifest.shards_size(); ++s) {
    for (const weightstore::v1::ShardPiece& piece : manifest.shards(s).pieces()) {
      const int gate = index_by_name.at(piece.tensor_name());
      std::optional<int> up;
      if (piece.fused_gate_up()) up = index_by_name.at(*transfer::UpProjName(piece.tensor_name()));
      const transfer::TensorBox box = PieceBox(piece, manifest.tensors(gate));
      for (Placement& placement : PlaceBox(gate, up, box, piece.fused_dim() + 1)) {
        placement.shard = s;
        placement.buffer_offset = piece.byte_offset();
        sources[placement.tensor].push_back(std::move(placement));
      }
    }
  }
  return sources;
}

// A target tensor and the placements of its canonical parts in it.
struct Target {
  weightstore::v1::TargetTensor tensor;
  std::vector<Placement> parts;
};

// gate tensor index -> up_proj tensor index, for the pairs a fusing consumer joins.
absl::flat_hash_map<int, int> FusedPairs(const weightstore::v1::Manifest& manifest) {
  const absl::flat_hash_map<absl::string_view, int> index_by_name = IndexByName(manifest);
  absl::flat_hash_map<int, int> pairs;
  for (int t = 0; t < manifest.tensors_size(); ++t) {
    const std::optional<std::string> up_name =
        transfer::UpProjName(manifest.tensors(t).spec().name());
    if (!up_name.has_value()) continue;
    const auto up = index_by_name.find(*up_name);
    if (up != index_by_name.end() &&
        transfer::CanFuseGateUp(manifest.tensors(t), manifest.tensors(up->second))) {
      pairs[t] = up->second;
    }
  }
  return pairs;
}

std::string StackedName(absl::string_view name) {
  const std::string segment = absl::StrCat(".", transfer::kExpertPlaceholder);
  if (absl::StrContains(name, segment)) return absl::StrReplaceAll(name, {{segment, ""}});
  return absl::StrReplaceAll(name, {{transfer::kExpertPlaceholder, ""}});
}

// The target tensor holding `box` of canonical tensor `gate` (fused with `up` if set). With
// `stacked` the expert dim stays as the leading dim; otherwise box holds a single expert and
// the target drops that dim.
Target MakeTarget(const weightstore::v1::CanonicalTensor& canonical, std::string name, int gate,
                  std::optional<int> up, const transfer::TensorBox& box, bool stacked) {
  Target target;
  target.parts = PlaceBox(gate, up, box, 1);
  const std::vector<int64_t>& shape = target.parts[0].buffer_shape;
  type::v1::TensorSpec& spec = *target.tensor.mutable_spec();
  spec.set_name(std::move(name));
  spec.set_dtype(canonical.spec().dtype());
  spec.mutable_shape()->Add(shape.begin() + (stacked ? 0 : 1), shape.end());
  if (stacked) {
    target.tensor.set_expert_begin(static_cast<int32_t>(box.begin[0]));
    target.tensor.set_expert_end(static_cast<int32_t>(box.begin[0] + box.size[0]));
  }
  int64_t elements = 1;
  for (int64_t dim : shape) elements *= dim;
  target.tensor.set_byte_size(elements * transfer::ElementSize(canonical.spec().dtype()));
  return target;
}

// Appends the target tensors of canonical tensor `t` (fused with `up` if set).
absl::Status AddTargets(const weightstore::v1::Manifest& manifest, int t, std::optional<int> up,
                        const Consumer& consumer, std::vector<Target>& targets) {
  const weightstore::v1::CanonicalTensor& canonical = manifest.tensors(t);
  const bool expert_group = transfer::IsRoutedExpertTensor(canonical.spec().name());
  absl::StatusOr<transfer::TensorBox> box =
      transfer::RankBox(canonical, expert_group ? consumer.expert_tp_rank : consumer.tp_rank,
                        expert_group ? consumer.expert_tp_size : consumer.tp_size, consumer.ep_rank,
                        consumer.ep_size);
  if (!box.ok()) {
    // Which size does not divide: the TP one unless the tensor splits evenly without EP.
    const bool tp_fits =
        transfer::RankBox(canonical, expert_group ? consumer.expert_tp_rank : consumer.tp_rank,
                          expert_group ? consumer.expert_tp_size : consumer.tp_size, 0, 1)
            .ok();
    const absl::string_view field = !tp_fits ? (expert_group ? "target.expert_tp_size"
                                                             : "target.tp_size")
                                             : "target.ep_size";
    return Invalid(field, "target layout: ", box.status().message());
  }
  std::string name = canonical.spec().name();
  if (up.has_value()) name = absl::StrReplaceAll(name, {{"gate_proj", "gate_up_proj"}});
  if (canonical.num_experts() == 0) {
    targets.push_back(MakeTarget(canonical, std::move(name), t, up, *box, false));
  } else if (consumer.stack_experts) {
    targets.push_back(MakeTarget(canonical, StackedName(name), t, up, *box, true));
  } else {
    transfer::TensorBox expert_box = *box;
    expert_box.size[0] = 1;
    for (int64_t e = box->begin[0]; e < box->begin[0] + box->size[0]; ++e) {
      expert_box.begin[0] = e;
      targets.push_back(MakeTarget(
          canonical, absl::StrReplaceAll(name, {{transfer::kExpertPlaceholder, absl::StrCat(e)}}),
          t, up, expert_box, false));
    }
  }
  return absl::OkStatus();
}

// Every target tensor of the consumer, sorted by name. Two of one name are an error about the
// field at `clash_path` (the layout that makes them, or the manifest's tensors).
absl::StatusOr<std::vector<Target>> AllTargets(const weightstore::v1::Manifest& manifest,
                                               const Consumer& consumer,
                                               absl::string_view clash_path) {
  absl::flat_hash_map<int, int> pairs;
  if (consumer.fuse_gate_up) pairs = FusedPairs(manifest);
  absl::flat_hash_set<int> fused_ups;
  for (const auto& [gate, up] : pairs) fused_ups.insert(up);
  std::vector<Target> targets;
  for (int t = 0; t < manifest.tensors_size(); ++t) {
    if (fused_ups.contains(t)) continue;
    const auto pair = pairs.find(t);
    const std::optional<int> up =
        pair == pairs.end() ? std::nullopt : std::optional<int>(pair->second);
    if (absl::Status status = AddTargets(manifest, t, up, consumer, targets); !status.ok()) {
      return status;
    }
  }
  std::sort(targets.begin(), targets.end(), [](const Target& a, const Target& b) {
    return a.tensor.spec().name() < b.tensor.spec().name();
  });
  for (size_t i = 1; i < targets.size(); ++i) {
    if (targets[i].tensor.spec().name() == targets[i - 1].tensor.spec().name()) {
      return Invalid(clash_path, "two target tensors named '", targets[i].tensor.spec().name(),
                     "'");
    }
  }
  return targets;
}

absl::StatusOr<std::vector<Target>> SelectTargets(std::vector<Target> targets,
                                                  const std::vector<std::string>& names) {
  if (names.empty()) return targets;
  absl::flat_hash_set<absl::string_view> known;
  for (const Target& target : targets) known.insert(target.tensor.spec().name());
  for (size_t i = 0; i < names.size(); ++i) {
    // Sized first: the message repeats the name.
    if (absl::Status status =
            CheckMaxBytes(absl::StrCat("tensor_names[", i, "]"), names[i], kMaxTensorNameBytes);
        !status.ok()) {
      return status;
    }
    if (!known.contains(names[i])) {
      return Invalid(IndexPath("tensor_names", static_cast<int64_t>(i)), "unknown target tensor '",
                     names[i], "'");
    }
  }
  const absl::flat_hash_set<absl::string_view> wanted(names.begin(), names.end());
  std::vector<Target> selected;
  for (Target& target : targets) {
    if (wanted.contains(target.tensor.spec().name())) selected.push_back(std::move(target));
  }
  return selected;
}

// One dimension of a box copy: `count` steps of the given byte strides.
struct Step {
  int64_t count = 0;
  int64_t src_stride = 0;
  int64_t dst_stride = 0;
};

std::vector<int64_t> ByteStrides(absl::Span<const int64_t> shape, int64_t element_size) {
  std::vector<int64_t> strides(shape.size());
  int64_t stride = element_size;
  for (size_t d = shape.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= shape[d];
  }
  return strides;
}

// The steps of copying a box of `size` between buffers of the given shapes, outermost first,
// without size-1 dims, and with a dim merged into its outer neighbour where that neighbour steps
// exactly over it in both buffers (so contiguous runs become one step of element stride).
std::vector<Step> CopySteps(absl::Span<const int64_t> size, absl::Span<const int64_t> src_shape,
                            absl::Span<const int64_t> dst_shape, int64_t element_size) {
  const std::vector<int64_t> src_strides = ByteStrides(src_shape, element_size);
  const std::vector<int64_t> dst_strides = ByteStrides(dst_shape, element_size);
  std::vector<Step> steps;
  for (size_t d = 0; d < size.size(); ++d) {
    if (size[d] == 1) continue;
    const Step step{size[d], src_strides[d], dst_strides[d]};
    if (!steps.empty() && steps.back().src_stride == step.count * step.src_stride &&
        steps.back().dst_stride == step.count * step.dst_stride) {
      steps.back() = {steps.back().count * step.count, step.src_stride, step.dst_stride};
    } else {
      steps.push_back(step);
    }
  }
  return steps;
}

// Emits `pattern` once for every index of the `outer` steps.
void EmitOuter(absl::Span<const Step> outer, uint64_t src_offset, uint64_t dst_offset,
               const internal::v1::CopyOp& pattern, std::vector<internal::v1::CopyOp>& ops) {
  if (outer.empty()) {
    internal::v1::CopyOp& op = ops.emplace_back(pattern);
    op.set_src_offset(src_offset);
    op.set_dst_offset(dst_offset);
    return;
  }
  for (int64_t i = 0; i < outer[0].count; ++i) {
    EmitOuter(outer.subspan(1), src_offset + i * outer[0].src_stride,
              dst_offset + i * outer[0].dst_stride, pattern, ops);
  }
}

// Appends the ops copying the intersection of `src` and `dst` (same tensor) into dst's buffer:
// the innermost contiguous run is the block, the next step the op's count and strides, and
// each index of the remaining steps one op.
void AppendIntersection(const Placement& src, const Placement& dst, int64_t element_size,
                        std::vector<internal::v1::CopyOp>& ops) {
  const size_t rank = dst.box.begin.size();
  std::vector<int64_t> size(rank), src_at(rank), dst_at(rank);
  for (size_t d = 0; d < rank; ++d) {
    const int64_t begin = std::max(src.box.begin[d], dst.box.begin[d]);
    const int64_t end =
        std::min(src.box.begin[d] + src.box.size[d], dst.box.begin[d] + dst.box.size[d]);
    if (begin >= end) return;
    size[d] = end - begin;
    src_at[d] = src.origin[d] + begin - src.box.begin[d];
    dst_at[d] = dst.origin[d] + begin - dst.box.begin[d];
  }
  std::vector<Step> steps = CopySteps(size, src.buffer_shape, dst.buffer_shape, element_size);
  internal::v1::CopyOp pattern;
  pattern.set_shard_index(src.shard);
  pattern.set_length(element_size);
  pattern.set_count(1);
  if (!steps.empty() && steps.back().src_stride == element_size &&
      steps.back().dst_stride == element_size) {
    pattern.set_length(steps.back().count * element_size);
    steps.pop_back();
  }
  if (!steps.empty()) {
    pattern.set_count(steps.back().count);
    pattern.set_src_stride(steps.back().src_stride);
    pattern.set_dst_stride(steps.back().dst_stride);
    steps.pop_back();
  }
  const std::vector<int64_t> src_strides = ByteStrides(src.buffer_shape, element_size);
  const std::vector<int64_t> dst_strides = ByteStrides(dst.buffer_shape, element_size);
  uint64_t src_offset = src.buffer_offset;
  uint64_t dst_offset = 0;
  for (size_t d = 0; d < rank; ++d) {
    src_offset += src_at[d] * src_strides[d];
    dst_offset += dst_at[d] * dst_strides[d];
  }
  EmitOuter(steps, src_offset, dst_offset, pattern, ops);
}

bool SameBlockPattern(const internal::v1::CopyOp& a, const internal::v1::CopyOp& b) {
  return a.count() == b.count() &&
         (a.count() == 1 || (a.src_stride() == b.src_stride() && a.dst_stride() == b.dst_stride()));
}

// Joins `op` into `last` when each of op's blocks directly follows last's in both buffers (e.g.
// the up_proj half after the gate_proj half of every row of a fused tensor): longer blocks, and
// one contiguous block once blocks abut.
bool Widen(internal::v1::CopyOp& last, const internal::v1::CopyOp& op) {
  if (!SameBlockPattern(last, op) || op.src_offset() != last.src_offset() + last.length() ||
      op.dst_offset() != last.dst_offset() + last.length()) {
    return false;
  }
  last.set_length(last.length() + op.length());
  if (last.count() > 1 && last.src_stride() == last.length() &&
      last.dst_stride() == last.length()) {
    last.set_length(last.length() * last.count());
    last.set_count(1);
    last.clear_src_stride();
    last.clear_dst_stride();
  }
  return true;
}

// Joins `op` into `last` when op's blocks continue last's sequence of equal blocks at the same
// strides (e.g. consecutive per-expert pieces): more blocks.
bool Lengthen(internal::v1::CopyOp& last, const internal::v1::CopyOp& op) {
  if (last.length() != op.length() || (last.count() == 1 && op.src_offset() <= last.src_offset())) {
    return false;
  }
  // Ops arrive in ascending dst order, so a single-block `last` takes its strides from `op`.
  const uint64_t src_stride =
      last.count() == 1 ? op.src_offset() - last.src_offset() : last.src_stride();
  const uint64_t dst_stride =
      last.count() == 1 ? op.dst_offset() - last.dst_offset() : last.dst_stride();
  if (op.src_offset() != last.src_offset() + last.count() * src_stride ||
      op.dst_offset() != last.dst_offset() + last.count() * dst_stride ||
      (op.count() > 1 && (op.src_stride() != src_stride || op.dst_stride() != dst_stride))) {
    return false;
  }
  last.set_count(last.count() + op.count());
  last.set_src_stride(src_stride);
  last.set_dst_stride(dst_stride);
  return true;
}

// Joins `op`, the next op in dst order, into `last` where one op can do both.
bool Join(internal::v1::CopyOp& last, const internal::v1::CopyOp& op) {
  return last.shard_index() == op.shard_index() && (Widen(last, op) || Lengthen(last, op));
}

internal::v1::PlannedTensor Plan(Target target,
                                    const std::vector<std::vector<Placement>>& sources) {
  const int64_t element_size = transfer::ElementSize(target.tensor.spec().dtype());
  std::vector<internal::v1::CopyOp> ops;
  for (const Placement& part : target.parts) {
    for (const Placement& source : sources[part.tensor]) {
      AppendIntersection(source, part, element_size, ops);
    }
  }
  std::sort(ops.begin(), ops.end(),
            [](const internal::v1::CopyOp& a, const internal::v1::CopyOp& b) {
              return a.dst_offset() < b.dst_offset();
            });
  internal::v1::PlannedTensor planned;
  *planned.mutable_tensor() = std::move(target.tensor);
  for (const internal::v1::CopyOp& op : ops) {
    if (planned.ops_size() == 0 || !Join(*planned.mutable_ops()->rbegin(), op)) {
      *planned.add_ops() = op;
    }
  }
  return planned;
}

}  // namespace

absl::StatusOr<std::vector<internal::v1::PlannedTensor>> PlanReads(
    const weightstore::v1::Manifest& manifest, const weightstore::v1::TargetLayout& target,
    const std::vector<std::string>& tensor_names) {
  absl::StatusOr<Consumer> consumer = ResolveLayout(target);
  if (!consumer.ok()) return consumer.status();
  absl::StatusOr<std::vector<Target>> targets = AllTargets(manifest, *consumer, "target");
  if (!targets.ok()) return targets.status();
  targets = SelectTargets(*std::move(targets), tensor_names);
  if (!targets.ok()) return targets.status();
  const std::vector<std::vector<Placement>> sources = SourcePlacements(manifest);
  std::vector<internal::v1::PlannedTensor> planned;
  planned.reserve(targets->size());
  for (Target& t : *targets) planned.push_back(Plan(std::move(t), sources));
  return planned;
}

std::string PlanLayoutKey(const weightstore::v1::Manifest& manifest) {
  std::string layout;
  const auto append = [&layout](const google::protobuf::MessageLite& part) {
    const std::string bytes = part.SerializeAsString();
    absl::StrAppend(&layout, bytes.size(), ":", bytes);
  };
  append(manifest.lora());
  for (const weightstore::v1::CanonicalTensor& tensor : manifest.tensors()) append(tensor);
  for (const weightstore::v1::Shard& shard : manifest.shards()) {
    absl::StrAppend(&layout, "shard ", shard.byte_size(), ":");
    for (const weightstore::v1::ShardPiece& piece : shard.pieces()) append(piece);
  }
  const Sha256Digest digest = Sha256(layout);
  return std::string(digest.begin(), digest.end());
}

absl::Status CheckStackable(const weightstore::v1::Manifest& manifest) {
  Consumer stacked;
  stacked.stack_experts = true;
  absl::StatusOr<std::vector<Target>> targets = AllTargets(manifest, stacked, "manifest.tensors");
  if (!targets.ok()) return Annotate(targets.status(), "tensors: with experts stacked, ");
  return absl::OkStatus();
}

void ExecuteOps(const internal::v1::PlannedTensor& tensor,
                const std::vector<absl::string_view>& shards, char* dst) {
  for (const internal::v1::CopyOp& op : tensor.ops()) {
    const char* src = shards[op.shard_index()].data();
    for (uint64_t i = 0; i < op.count(); ++i) {
      std::memcpy(dst + op.dst_offset() + i * op.dst_stride(),
                  src + op.src_offset() + i * op.src_stride(), op.length());
    }
  }
}

}  // namespace tandem::weight_store
