#ifndef TANDEM_SERVICES_WEIGHT_STORE_CLIENT_SHARD_VERIFIER_H_
#define TANDEM_SERVICES_WEIGHT_STORE_CLIENT_SHARD_VERIFIER_H_

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/node_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/checksum.h"
#include "services/weight_store/client/shard_order.h"
#include "tandem/internal/v1/weight_store_ucx.pb.h"

namespace tandem::weight_store {

// Verifies the shards of a read plan with verify_shards while its tensors land, in any order and
// on any thread: each shard's bytes are hashed in shard order (InShardOrder) as they land, under
// that shard's lock, so the hashing overlaps the copies and gets of later tensors; Finish
// compares each shard with its checksum. The landed bytes stay where they are until Finish.
class ShardVerifier {
 public:
  // `plan` outlives the verifier.
  explicit ShardVerifier(const internal::v1::GetReadPlanResponse& plan);

  // Offers shard bytes [src_offset, src_offset + length) of shard `shard_index`, landed at
  // `bytes`.
  void Offer(int shard_index, uint64_t src_offset, const char* bytes, uint64_t length);
  // Offers every block of the plan's tensor `tensor`, landed in `bytes` (the whole tensor).
  void OfferTensor(int tensor, const char* bytes);
  // Copies every block the plan reads from shard `shard_index` out of `mapped_shard` (the shard
  // as mapped into this process) to `tensor_bytes(tensor)` + its offset, in the plan's order,
  // offering the bytes as read while they are in the nearest cache. A thread copying a shard
  // this way has it to itself: the shard's lock is taken once, not per block.
  void CopyShard(int shard_index, const char* mapped_shard,
                 absl::FunctionRef<char*(int tensor)> tensor_bytes);

  // OK if every shard was offered whole, each byte once, and hashes to its checksum; else
  // DATA_LOSS naming the shard. Where the bytes landed is the plan's: see CheckTiling.
  absl::Status Finish();

 private:
  // Bytes CopyShard copies before it hashes them: they are still in the core's cache.
  static constexpr uint64_t kRunBytes = uint64_t{64} << 10;

  struct Shard;
  // Offers a block of `shard`, whose lock the caller holds.
  static void OfferLocked(Shard& shard, uint64_t src_offset, const char* bytes, uint64_t length)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mutex);

  // An op of the plan and the index of the tensor it fills.
  struct TensorOp {
    int tensor = 0;
    const internal::v1::CopyOp* op = nullptr;
  };

  struct Shard {
    const internal::v1::ShardRegion* region = nullptr;
    std::vector<TensorOp> ops;  // The plan's ops that read the shard, in the plan's order.
    absl::Mutex mutex;
    InShardOrder order ABSL_GUARDED_BY(mutex);
    Xxh3Hasher hasher ABSL_GUARDED_BY(mutex);
    bool once ABSL_GUARDED_BY(mutex) = true;  // No byte offered twice.
  };

  const internal::v1::GetReadPlanResponse& plan_;
  absl::node_hash_map<int, Shard> shards_;  // By shard index; fixed once constructed.
};

}  // namespace tandem::weight_store

#endif  // TANDEM_SERVICES_WEIGHT_STORE_CLIENT_SHARD_VERIFIER_H_
