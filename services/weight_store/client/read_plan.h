#ifndef TANDEM_SERVICES_WEIGHT_STORE_CLIENT_READ_PLAN_H_
#define TANDEM_SERVICES_WEIGHT_STORE_CLIENT_READ_PLAN_H_

// The geometry of a weight-store read plan as a UCX fetcher executes it: which tensors can be
// read straight into their memory, which bytes of a shard to stage for the others, how to
// batch the gets, and the bounds check that keeps a faulty plan from writing past memory.

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "tandem/internal/v1/weight_store_ucx.pb.h"
#include "tandem/weightstore/v1/weight_store.pb.h"

namespace tandem::weight_store {

// Source bytes [begin, end) of one shard, pulled into local memory in one piece.
struct StagedSpan {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t staged_at = 0;  // Offset of its bytes in the fetcher's staging memory.
};

// Whether a tensor's copies are all single blocks of at least kMinDirectReadBytes, which land
// in its memory as they are. The others are staged: plans of sliced layouts hold many small
// strided blocks, where a round trip per block would cost far more than the bytes; and small
// single blocks (a stacked expert tensor has one of 16-32 KiB per expert) cost a get each,
// which over tcp the store's CPU serves, while staged they come in a few large gets and are
// copied from there: a 59 MiB fetch is ~6% faster on tcp, the same on shared memory.
bool ReadsDirectly(const internal::v1::PlannedTensor& tensor);
inline constexpr uint64_t kMinDirectReadBytes = uint64_t{256} << 10;

// One past the last byte of `count` blocks of `length` bytes, `stride` apart from `offset`;
// nullopt on overflow or when there are no bytes.
std::optional<uint64_t> EndOfBlocks(uint64_t offset, uint64_t count, uint64_t stride,
                                    uint64_t length);

// One block of a planned tensor: `length` bytes from `source` to byte `dst_offset` of it.
struct PlannedBlock {
  uint64_t dst_offset = 0;
  const char* source = nullptr;
  uint64_t length = 0;
};

// The blocks of `tensor`'s ops in destination order, read from `shard_base(shard_index)` (a
// shard's first byte, in whatever memory holds it). A valid plan's blocks tile the tensor, so
// in this order they are its bytes in order: what its checksum hashes.
std::vector<PlannedBlock> BlocksInDestinationOrder(
    const internal::v1::PlannedTensor& tensor,
    absl::FunctionRef<const char*(int shard_index)> shard_base);

// Whether `tensor`'s blocks tile it: every byte of it written once.
bool TilesTensor(const internal::v1::PlannedTensor& tensor);

// OK if every tensor of `plan` is tiled by its blocks, else DATA_LOSS naming the tensor. What a
// reader verifying shards (verify_shards) checks besides them: shard checksums verify the bytes
// read, not where they were written.
absl::Status CheckTiling(const internal::v1::GetReadPlanResponse& plan);

// Calls `visit(src_offset, length)` for the shard bytes `op` reads, in shard order: once for
// an op whose blocks follow each other in the shard, else once per block.
void ForEachSourceSpan(const internal::v1::CopyOp& op,
                       absl::FunctionRef<void(uint64_t src_offset, uint64_t length)> visit);

// Whether `tensors` (a read plan's) read each shard they use whole, each byte once
// (`shard_bytes(i)`: the size of shard i): then the shards' checksums verify every byte read.
bool ReadsShardsWhole(
    const google::protobuf::RepeatedPtrField<internal::v1::PlannedTensor>& tensors,
    absl::FunctionRef<uint64_t(int shard_index)> shard_bytes);

using RegionsByShard = absl::flat_hash_map<int, const internal::v1::ShardRegion*>;

// The plan's shard regions by index, once every op was checked to stay inside its shard region
// and its tensor: the plan says where the fetcher's gets and copies write, and a faulty store
// must not make it write past its memory. INTERNAL naming the tensor otherwise.
absl::StatusOr<RegionsByShard> CheckedRegions(const internal::v1::GetReadPlanResponse& plan);

// The merged spans of a shard that the staged tensors (those not read directly) among
// [first, last) of a checked plan read; each op's whole strided range lies in one. Spans closer
// than a gap that costs less than another round trip are merged.
std::vector<StagedSpan> SpansOf(const internal::v1::GetReadPlanResponse& plan, int first,
                                int last, int shard);

// Consecutive tensors [first, last) of a plan, about kBatchBytes together.
struct TensorBatch {
  int first = 0;
  int last = 0;
};

// Tensors are pulled in batches of about this many bytes: the copies and checksums of a batch
// that has arrived overlap the gets of the next.
inline constexpr uint64_t kBatchBytes = uint64_t{16} << 20;

std::vector<TensorBatch> BatchesOf(const internal::v1::GetReadPlanResponse& plan);

}  // namespace tandem::weight_store

#endif  // TANDEM_SERVICES_WEIGHT_STORE_CLIENT_READ_PLAN_H_
