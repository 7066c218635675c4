#include "services/weight_store/read_planner.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/identifier.h"
#include "common/parallel_tasks.h"
#include "common/status.h"
#include "services/weight_store/client/read_plan.h"
#include "services/weight_store/manifest.h"
#include "services/weight_store/reshard.h"
#include "services/weight_store/tensor_assembly.h"

namespace tandem::weight_store {

internal::v1::ShardRegion ShardRegionOf(int32_t shard_index, const transfer::UcxRegion& region) {
  internal::v1::ShardRegion result;
  result.set_shard_index(shard_index);
  result.set_remote_address(region.remote_address());
  result.set_rkey(region.packed_rkey());
  result.set_length(region.length());
  return result;
}

absl::StatusOr<internal::v1::GetReadPlanResponse> ReadPlanner::Plan(
    const internal::v1::GetReadPlanRequest& request) {
  if (request.target().dtype() != type::v1::DTYPE_UNSPECIFIED) {
    return InvalidField("target.dtype", "GetReadPlan never converts: leave target.dtype unset");
  }
  if (absl::Status status = ValidateVersionOf(request.adapter_name(), request.version());
      !status.ok()) {
    return status;
  }
  if (absl::Status status = ValidateIdentifier("lease_id", request.lease_id()); !status.ok()) {
    return status;
  }
  if (!request.has_target()) {
    return InvalidField("target", "target is required (an empty TargetLayout is one rank)");
  }
  absl::StatusOr<std::shared_ptr<const CommittedVersion>> version =
      store_.LeasedVersion(request.lease_id(), request.adapter_name(), request.version());
  if (!version.ok()) return version.status();
  absl::StatusOr<std::shared_ptr<const LayoutReads>> reads = CachedReads(request, **version);
  if (!reads.ok()) return reads.status();
  if (request.shard_checksums() && (*reads)->reads_shards_whole) {
    // The layout's reads, where this version's shards are and the checksums its commit
    // verified: nothing to compute per version.
    return PlanOf(**reads, **version, /*shard_checksums=*/true);
  }
  return PlanWithTensorChecksums(request, **reads, **version);
}

internal::v1::GetReadPlanResponse ReadPlanner::PlanWithTensorChecksums(
    const internal::v1::GetReadPlanRequest& request, const LayoutReads& reads,
    const CommittedVersion& version) {
  // What the plan depends on: the request less its lease, and where the version's shards are
  // (a version withdrawn and published again has the same number in other memory). A plan
  // cached for these exact names was checked when it was computed.
  internal::v1::GetReadPlanRequest cache_request = request;
  cache_request.clear_lease_id();
  std::string cache_key = cache_request.SerializeAsString();
  for (const std::unique_ptr<ShardBuffer>& shard : version.shards) {
    absl::StrAppend(&cache_key, "@", reinterpret_cast<uintptr_t>(shard->data()));
  }
  std::shared_ptr<PlanInFlight> in_flight;
  {
    absl::MutexLock lock(&mutex_);
    if (auto it = cache_.find(cache_key); it != cache_.end()) return *it->second;
    if (auto it = in_flight_.find(cache_key); it != in_flight_.end()) {
      in_flight = it->second;
    } else {
      in_flight_[cache_key] = std::make_shared<PlanInFlight>();
    }
  }
  if (in_flight != nullptr) {
    in_flight->done.WaitForNotification();
    return *in_flight->plan;
  }
  auto plan = std::make_shared<internal::v1::GetReadPlanResponse>(
      PlanOf(reads, version, /*shard_checksums=*/false));
  {
    // Hashing the version's bytes is most of a plan's cost, and the replicas that asked for it
    // wait: this thread and a helper share the tensors.
    ParallelTasks checksums;
    for (internal::v1::PlannedTensor& tensor : *plan->mutable_tensors()) {
      checksums.Add([&tensor, &version] {
        tensor.mutable_tensor()->set_xxh3_64(TensorChecksum(tensor, version));
        return absl::OkStatus();
      });
    }
    checksums.Finish().IgnoreError();  // The tasks cannot fail.
  }
  absl::MutexLock lock(&mutex_);
  if (cache_.size() >= kMaxCacheEntries) cache_.clear();
  cache_[cache_key] = plan;
  auto node = in_flight_.extract(cache_key);
  node.mapped()->plan = plan;
  node.mapped()->done.Notify();
  return *plan;
}

absl::StatusOr<std::shared_ptr<const ReadPlanner::LayoutReads>> ReadPlanner::CachedReads(
    const internal::v1::GetReadPlanRequest& request, const CommittedVersion& version) {
  const weightstore::v1::Manifest& manifest = version.manifest;
  // What PlanReads reads: the reader's target and names, and the manifest's layout.
  internal::v1::GetReadPlanRequest asked;
  *asked.mutable_target() = request.target();
  *asked.mutable_tensor_names() = request.tensor_names();
  const std::string key =
      absl::StrCat(asked.SerializeAsString(),
                   version.layout_key.empty() ? PlanLayoutKey(manifest) : version.layout_key);
  {
    absl::MutexLock lock(&mutex_);
    if (auto it = reads_.find(key); it != reads_.end()) return it->second;
  }
  absl::StatusOr<std::vector<internal::v1::PlannedTensor>> tensors = PlanReads(
      manifest, request.target(),
      std::vector<std::string>(request.tensor_names().begin(), request.tensor_names().end()));
  if (!tensors.ok()) return tensors.status();
  auto reads = std::make_shared<LayoutReads>();
  std::vector<bool> used(manifest.shards_size(), false);
  for (internal::v1::PlannedTensor& tensor : *tensors) {
    for (const internal::v1::CopyOp& op : tensor.ops()) used[op.shard_index()] = true;
    *reads->tensors.Add() = std::move(tensor);
  }
  for (size_t i = 0; i < used.size(); ++i) {
    if (used[i]) reads->shards.push_back(static_cast<int32_t>(i));
  }
  reads->reads_shards_whole = ReadsShardsWhole(
      reads->tensors, [&manifest](int shard) { return manifest.shards(shard).byte_size(); });
  absl::MutexLock lock(&mutex_);
  if (reads_.size() >= kMaxCacheEntries) reads_.clear();
  reads_[key] = reads;
  return reads;
}

internal::v1::GetReadPlanResponse ReadPlanner::PlanOf(const LayoutReads& reads,
                                                      const CommittedVersion& version,
                                                      bool shard_checksums) const {
  internal::v1::GetReadPlanResponse plan;
  *plan.mutable_tensors() = reads.tensors;
  for (const int32_t shard : reads.shards) {
    internal::v1::ShardRegion& region = *plan.add_shards();
    region = ShardRegionOf(shard, *version.shards[shard]->region());
    if (shard_checksums) region.set_xxh3_64(version.manifest.shards(shard).xxh3_64());
  }
  plan.set_store_worker_address(ucx_.address());
  plan.set_verify_shards(shard_checksums);
  return plan;
}

}  // namespace tandem::weight_store
