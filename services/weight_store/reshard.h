#ifndef TANDEM_SERVICES_WEIGHT_STORE_RESHARD_H_
#define TANDEM_SERVICES_WEIGHT_STORE_RESHARD_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tandem/internal/v1/weight_store_ucx.pb.h"
#include "tandem/weightstore/v1/weight_store.pb.h"

namespace tandem::weight_store {

// The tensors one consumer rank of `target` holds, in byte-wise name order, each with the CopyOps
// that fill it from the manifest's shards: ascending dst_offset, every byte exactly once, with
// contiguous runs merged into long blocks and regular patterns into strided ops (a row-split
// slice of a row-major tensor is one op with count = rows).
//
// `manifest` must have passed ValidateManifest. Sharding follows TargetLayout (attention, dense
// and other tensors by tp, routed-expert tensors by expert_tp, per-expert ones also by ep);
// tensors whose name is no LoRA projection are delivered whole. Names: canonical, with
// fuse_gate_up joining a gate_proj tensor and its up_proj partner into "...gate_up_proj..."
// (gate then up along canonical dim 0) and stack_experts giving one tensor per per-expert family
// ([E_local, ...], name without ".{e}", expert_begin/end set) instead of one per expert ("{e}"
// -> the expert id). TENSOR_NAMING_ENGINE_NATIVE: the same with stack_experts forced on, as the
// embedded engine stores experts stacked. Shapes, byte sizes and the plan are in the stored
// dtype whatever target.dtype says; xxh3_64 is left unset.
//
// `tensor_names`, when non-empty, selects target tensors by name. INVALID_ARGUMENT for a bad
// layout (ranks, sizes, enums), sizes that do not divide evenly, an unknown requested name, or
// two target tensors with the same name.
absl::StatusOr<std::vector<internal::v1::PlannedTensor>> PlanReads(
    const weightstore::v1::Manifest& manifest, const weightstore::v1::TargetLayout& target,
    const std::vector<std::string>& tensor_names);

// What PlanReads reads of `manifest` (its LoRA config, tensors, and each shard's size and
// pieces), which the versions of a job share while their bytes, checksums and labels differ, as
// its SHA-256: a key under which plans are computed once per layout. A hash, since a layout can
// be megabytes, and a cryptographic one, since a key one publisher could give another layout on
// purpose would hand readers a plan of other bytes. About 6.5 ms for 5,600 tensors.
std::string PlanLayoutKey(const weightstore::v1::Manifest& manifest);

// OK if the manifest's expert tensors stack (TargetLayout.stack_experts, which the embedded
// engine always uses) without two target tensors taking one name, as when a side is both
// shared and per-expert; INVALID_ARGUMENT naming the tensor otherwise. `manifest` must have
// passed ValidateManifest.
absl::Status CheckStackable(const weightstore::v1::Manifest& manifest);

// Runs a tensor's ops from the shards' bytes (indexed by shard_index) into `dst`, which holds
// tensor.byte_size bytes. The shards must be those of the planned manifest.
void ExecuteOps(const internal::v1::PlannedTensor& tensor,
                const std::vector<absl::string_view>& shards, char* dst);

}  // namespace tandem::weight_store

#endif  // TANDEM_SERVICES_WEIGHT_STORE_RESHARD_H_
