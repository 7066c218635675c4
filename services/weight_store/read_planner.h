#ifndef TANDEM_SERVICES_WEIGHT_STORE_READ_PLANNER_H_
#define TANDEM_SERVICES_WEIGHT_STORE_READ_PLANNER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "services/weight_store/adapter_store.h"
#include "tandem/internal/v1/weight_store_ucx.pb.h"
#include "transfer/ucx_transport.h"

namespace tandem::weight_store {

// Where a shard's bytes are for one-sided UCX access: address, packed key and length.
internal::v1::ShardRegion ShardRegionOf(int32_t shard_index, const transfer::UcxRegion& region);

// Read plans of leased versions for UCX readers: which gets assemble each target tensor, with
// every tensor's checksum, or, for readers that verify shards and a plan that reads them whole,
// the shards' (verified at commit: no pass over the bytes). The reads are planned once per
// manifest layout. Plans with tensor checksums are cached per (version, layout, names), since
// checksumming costs a pass over the bytes and every replica of a deployment asks for the same
// few layouts; replicas that ask for a plan being computed wait for it instead of computing it
// again.
class ReadPlanner {
 public:
  // `ucx` and `store` outlive the planner.
  ReadPlanner(const transfer::UcxWorker& ucx, AdapterStore& store) : ucx_(ucx), store_(store) {}

  absl::StatusOr<internal::v1::GetReadPlanResponse> Plan(
      const internal::v1::GetReadPlanRequest& request);

 private:
  // PlanReads for a layout: its tensors' reads, the shards they use (ascending), and whether
  // they read each of those whole.
  struct LayoutReads {
    google::protobuf::RepeatedPtrField<internal::v1::PlannedTensor> tensors;
    std::vector<int32_t> shards;
    bool reads_shards_whole = false;
  };

  // The plan of a leased version with every tensor's checksum (a pass over its bytes), cached
  // per version, layout and names.
  internal::v1::GetReadPlanResponse PlanWithTensorChecksums(
      const internal::v1::GetReadPlanRequest& request, const LayoutReads& reads,
      const CommittedVersion& version);
  // PlanReads for `request`'s target of `version`'s layout, computed once per layout (see
  // PlanLayoutKey).
  absl::StatusOr<std::shared_ptr<const LayoutReads>> CachedReads(
      const internal::v1::GetReadPlanRequest& request, const CommittedVersion& version);
  // `reads` of `version`'s shards, with the shards' checksums or with none (yet).
  internal::v1::GetReadPlanResponse PlanOf(const LayoutReads& reads,
                                           const CommittedVersion& version,
                                           bool shard_checksums) const;

  static constexpr size_t kMaxCacheEntries = 64;
  using SharedPlan = std::shared_ptr<const internal::v1::GetReadPlanResponse>;
  struct PlanInFlight {
    absl::Notification done;
    SharedPlan plan;
  };

  const transfer::UcxWorker& ucx_;
  AdapterStore& store_;
  absl::Mutex mutex_;
  // Plans are kept and handed between threads by pointer: a large adapter's is megabytes.
  absl::flat_hash_map<std::string, SharedPlan> cache_ ABSL_GUARDED_BY(mutex_);
  absl::flat_hash_map<std::string, std::shared_ptr<PlanInFlight>> in_flight_
      ABSL_GUARDED_BY(mutex_);
  absl::flat_hash_map<std::string, std::shared_ptr<const LayoutReads>> reads_
      ABSL_GUARDED_BY(mutex_);
};

}  // namespace tandem::weight_store

#endif  // TANDEM_SERVICES_WEIGHT_STORE_READ_PLANNER_H_
