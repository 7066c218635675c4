#include "services/weight_store/client/shard_verifier.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/streaming_copy.h"

namespace tandem::weight_store {

ShardVerifier::ShardVerifier(const internal::v1::GetReadPlanResponse& plan) : plan_(plan) {
  for (const internal::v1::ShardRegion& region : plan.shards()) {
    shards_[region.shard_index()].region = &region;
  }
  for (int tensor = 0; tensor < plan.tensors_size(); ++tensor) {
    for (const internal::v1::CopyOp& op : plan.tensors(tensor).ops()) {
      shards_.at(op.shard_index()).ops.push_back({tensor, &op});
    }
  }
}

void ShardVerifier::OfferLocked(Shard& shard, uint64_t src_offset, const char* bytes,
                                uint64_t length) {
  shard.once =
      shard.once &&
      shard.order.Offer(src_offset, bytes, length, [&shard](const char* in_order, uint64_t n) {
        shard.hasher.Update(absl::string_view(in_order, n));
      });
}

void ShardVerifier::Offer(int shard_index, uint64_t src_offset, const char* bytes,
                          uint64_t length) {
  Shard& shard = shards_.at(shard_index);
  absl::MutexLock lock(&shard.mutex);
  OfferLocked(shard, src_offset, bytes, length);
}

void ShardVerifier::CopyShard(int shard_index, const char* mapped_shard,
                              absl::FunctionRef<char*(int tensor)> tensor_bytes) {
  Shard& shard = shards_.at(shard_index);
  absl::MutexLock lock(&shard.mutex);
  // The bytes are hashed as read, a run of them at a time while it is in cache: consecutive
  // blocks that follow each other in the shard make one run, however far apart they land.
  // They are stored with streaming stores: the tensors' memory is not read back here.
  StreamingCopier copier;
  uint64_t run_offset = 0;
  uint64_t run_length = 0;
  const auto offer_run = [&] {
    if (run_length > 0) OfferLocked(shard, run_offset, mapped_shard + run_offset, run_length);
    run_length = 0;
  };
  for (const auto& [tensor, op_of_tensor] : shard.ops) {
    const internal::v1::CopyOp& op = *op_of_tensor;
    char* destination = tensor_bytes(tensor) + op.dst_offset();
    for (uint64_t i = 0; i < op.count(); ++i) {
      const uint64_t src_offset = op.src_offset() + i * op.src_stride();
      for (uint64_t done = 0; done < op.length(); done += kRunBytes) {
        const uint64_t length = std::min(kRunBytes, op.length() - done);
        copier.Copy(destination + i * op.dst_stride() + done, mapped_shard + src_offset + done,
                    length);
        if (run_offset + run_length != src_offset + done) {
          offer_run();
          run_offset = src_offset + done;
        }
        run_length += length;
        if (run_length >= kRunBytes) offer_run();
      }
    }
  }
  offer_run();
}

void ShardVerifier::OfferTensor(int tensor, const char* bytes) {
  for (const internal::v1::CopyOp& op : plan_.tensors(tensor).ops()) {
    for (uint64_t i = 0; i < op.count(); ++i) {
      Offer(op.shard_index(), op.src_offset() + i * op.src_stride(),
            bytes + op.dst_offset() + i * op.dst_stride(), op.length());
    }
  }
}

absl::Status ShardVerifier::Finish() {
  for (auto& [index, shard] : shards_) {
    absl::MutexLock lock(&shard.mutex);
    if (!shard.once || !shard.order.Complete(shard.region->length())) {
      return absl::DataLossError(
          absl::StrCat("shard ", index,
                       ": the read plan does not read it whole, each byte once, as "
                       "verify_shards says"));
    }
    if (const uint64_t checksum = shard.hasher.Digest(); checksum != shard.region->xxh3_64()) {
      return absl::DataLossError(absl::StrFormat("shard %d: got xxh3 0x%016x, expected 0x%016x",
                                                 index, checksum, shard.region->xxh3_64()));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::weight_store
