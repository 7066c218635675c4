#include "services/weight_store/client/read_plan.h"

#include <algorithm>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "services/weight_store/client/shard_order.h"

namespace tandem::weight_store {
namespace {

// Spans closer than this are pulled as one. Gets are pipelined, so another one costs its
// per-operation work (about what 64 KiB take on loopback tcp), not a round trip; and the gap
// between staged tensors mostly holds tensors that are read directly, so merging across it
// reads their bytes twice (29% more bytes than the adapter's at a 1 MiB gap, 4% at 64 KiB).
constexpr uint64_t kSpanMergeGap = uint64_t{64} << 10;

bool IsLargeSingleBlock(const internal::v1::CopyOp& op) {
  const bool contiguous =
      op.count() == 1 || (op.src_stride() == op.length() && op.dst_stride() == op.length());
  return contiguous && op.count() * op.length() >= kMinDirectReadBytes;
}

}  // namespace

bool ReadsDirectly(const internal::v1::PlannedTensor& tensor) {
  return std::all_of(tensor.ops().begin(), tensor.ops().end(), IsLargeSingleBlock);
}

std::vector<PlannedBlock> BlocksInDestinationOrder(
    const internal::v1::PlannedTensor& tensor,
    absl::FunctionRef<const char*(int shard_index)> shard_base) {
  std::vector<PlannedBlock> blocks;
  for (const internal::v1::CopyOp& op : tensor.ops()) {
    const char* source = shard_base(op.shard_index()) + op.src_offset();
    for (uint64_t i = 0; i < op.count(); ++i) {
      blocks.push_back(
          {op.dst_offset() + i * op.dst_stride(), source + i * op.src_stride(), op.length()});
    }
  }
  const auto by_destination = [](const PlannedBlock& a, const PlannedBlock& b) {
    return a.dst_offset < b.dst_offset;
  };
  // Plans list ops by destination, so their blocks usually are already.
  if (!std::is_sorted(blocks.begin(), blocks.end(), by_destination)) {
    std::sort(blocks.begin(), blocks.end(), by_destination);
  }
  return blocks;
}

bool TilesTensor(const internal::v1::PlannedTensor& tensor) {
  // The ops' blocks are walked in destination order by merging the ops (a heap of each op's
  // next block): plans interleave a few ops' blocks, which this orders without sorting them.
  // Blocks of no bytes write nothing.
  struct NextBlock {
    uint64_t dst_offset = 0;
    uint64_t left = 0;  // Blocks of the op from this one on.
    const internal::v1::CopyOp* op = nullptr;
  };
  absl::InlinedVector<NextBlock, 8> heap;
  for (const internal::v1::CopyOp& op : tensor.ops()) {
    if (op.count() > 0 && op.length() > 0) heap.push_back({op.dst_offset(), op.count(), &op});
  }
  const auto later = [](const NextBlock& a, const NextBlock& b) {
    return a.dst_offset > b.dst_offset;
  };
  std::make_heap(heap.begin(), heap.end(), later);
  uint64_t tiled = 0;  // Bytes [0, tiled) are written, each once.
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    NextBlock& next = heap.back();
    if (next.dst_offset != tiled) return false;
    const internal::v1::CopyOp& op = *next.op;
    if (next.left == 1 || op.dst_stride() == op.length()) {
      // The op's blocks left follow each other: a block of another op that starts among them
      // overlaps them, and is found out when its turn comes.
      uint64_t bytes = 0;
      if (__builtin_mul_overflow(next.left, op.length(), &bytes) ||
          __builtin_add_overflow(tiled, bytes, &tiled)) {
        return false;
      }
      heap.pop_back();
      continue;
    }
    if (__builtin_add_overflow(tiled, op.length(), &tiled)) return false;
    next.dst_offset += op.dst_stride();
    --next.left;
    std::push_heap(heap.begin(), heap.end(), later);
  }
  return tiled == tensor.tensor().byte_size();
}

absl::Status CheckTiling(const internal::v1::GetReadPlanResponse& plan) {
  for (const internal::v1::PlannedTensor& tensor : plan.tensors()) {
    if (!TilesTensor(tensor)) {
      return absl::DataLossError(absl::StrCat("tensor ", tensor.tensor().spec().name(),
                                              ": the read plan's blocks do not tile it"));
    }
  }
  return absl::OkStatus();
}

void ForEachSourceSpan(const internal::v1::CopyOp& op,
                       absl::FunctionRef<void(uint64_t src_offset, uint64_t length)> visit) {
  if (op.count() == 1 || op.src_stride() == op.length()) {
    visit(op.src_offset(), op.count() * op.length());
    return;
  }
  for (uint64_t i = 0; i < op.count(); ++i) {
    visit(op.src_offset() + i * op.src_stride(), op.length());
  }
}

bool ReadsShardsWhole(
    const google::protobuf::RepeatedPtrField<internal::v1::PlannedTensor>& tensors,
    absl::FunctionRef<uint64_t(int shard_index)> shard_bytes) {
  absl::flat_hash_map<int, InShardOrder> orders;  // By shard index.
  bool once = true;
  for (const internal::v1::PlannedTensor& tensor : tensors) {
    for (const internal::v1::CopyOp& op : tensor.ops()) {
      InShardOrder& order = orders[op.shard_index()];
      ForEachSourceSpan(op, [&](uint64_t src_offset, uint64_t length) {
        once = once && order.Offer(src_offset, nullptr, length, [](const char*, uint64_t) {});
      });
    }
  }
  return once && absl::c_all_of(orders, [&shard_bytes](const auto& shard_and_order) {
           return shard_and_order.second.Complete(shard_bytes(shard_and_order.first));
         });
}

std::optional<uint64_t> EndOfBlocks(uint64_t offset, uint64_t count, uint64_t stride,
                                    uint64_t length) {
  uint64_t span = 0;
  uint64_t end = 0;
  if (count == 0 || length == 0 || __builtin_mul_overflow(count - 1, stride, &span) ||
      __builtin_add_overflow(offset, span, &end) || __builtin_add_overflow(end, length, &end)) {
    return std::nullopt;
  }
  return end;
}

absl::StatusOr<RegionsByShard> CheckedRegions(const internal::v1::GetReadPlanResponse& plan) {
  RegionsByShard regions;
  for (const internal::v1::ShardRegion& region : plan.shards()) {
    if (!regions.emplace(region.shard_index(), &region).second) {
      return absl::InternalError(
          absl::StrCat("read plan lists shard ", region.shard_index(), " twice"));
    }
  }
  for (const internal::v1::PlannedTensor& tensor : plan.tensors()) {
    for (const internal::v1::CopyOp& op : tensor.ops()) {
      const auto region = regions.find(op.shard_index());
      const std::optional<uint64_t> src_end =
          EndOfBlocks(op.src_offset(), op.count(), op.src_stride(), op.length());
      const std::optional<uint64_t> dst_end =
          EndOfBlocks(op.dst_offset(), op.count(), op.dst_stride(), op.length());
      if (region == regions.end() || !src_end || *src_end > region->second->length() || !dst_end ||
          *dst_end > tensor.tensor().byte_size()) {
        return absl::InternalError(absl::StrCat("read plan of tensor ",
                                                tensor.tensor().spec().name(),
                                                " reads or writes out of bounds"));
      }
    }
  }
  return regions;
}

std::vector<StagedSpan> SpansOf(const internal::v1::GetReadPlanResponse& plan, int first,
                                int last, int shard) {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (int i = first; i < last; ++i) {
    if (ReadsDirectly(plan.tensors(i))) continue;
    for (const internal::v1::CopyOp& op : plan.tensors(i).ops()) {
      if (op.shard_index() != shard) continue;
      ranges.emplace_back(op.src_offset(),
                          *EndOfBlocks(op.src_offset(), op.count(), op.src_stride(), op.length()));
    }
  }
  std::sort(ranges.begin(), ranges.end());
  std::vector<StagedSpan> spans;
  for (const auto& [begin, end] : ranges) {
    if (!spans.empty() && begin <= spans.back().end + kSpanMergeGap) {
      spans.back().end = std::max(spans.back().end, end);
    } else {
      spans.push_back({.begin = begin, .end = end});
    }
  }
  return spans;
}

std::vector<TensorBatch> BatchesOf(const internal::v1::GetReadPlanResponse& plan) {
  std::vector<TensorBatch> batches;
  uint64_t bytes = kBatchBytes;
  for (int i = 0; i < plan.tensors_size(); ++i) {
    if (bytes >= kBatchBytes) {
      batches.push_back({.first = i, .last = i});
      bytes = 0;
    }
    ++batches.back().last;
    bytes += plan.tensors(i).tensor().byte_size();
  }
  return batches;
}

}  // namespace tandem::weight_store
