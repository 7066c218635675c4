// A manifest arrives from a publisher (BeginUpload) and is read back from disk at every start:
// any bytes must decode to a clear status, and a manifest that validates must plan reads for any
// target layout that stay inside its shards and fill every target byte exactly once.
//
// Input: 1 byte choosing the target layout, then the manifest file (TMAN envelope or raw proto).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/checksummed_message.h"
#include "common/testing/fuzz_check.h"
#include "services/weight_store/manifest.h"
#include "services/weight_store/reshard.h"
#include "tandem/internal/v1/weight_store_ucx.pb.h"
#include "tandem/weightstore/v1/weight_store.pb.h"

namespace tandem::weight_store {
namespace {

using ::tandem::testing::FuzzCheck;

// Plans over bigger adapters are checked byte by byte only up to this size.
constexpr uint64_t kMaxCheckedBytes = uint64_t{1} << 22;

weightstore::v1::TargetLayout LayoutFrom(uint8_t choice) {
  weightstore::v1::TargetLayout target;
  target.set_tp_size(choice & 1 ? 2 : 1);
  target.set_tp_rank(choice & 2 ? target.tp_size() - 1 : 0);
  target.set_ep_size(choice & 4 ? 2 : 1);
  target.set_ep_rank(choice & 2 ? target.ep_size() - 1 : 0);
  target.set_expert_tp_size(1);
  target.set_fuse_gate_up(choice & 8);
  target.set_stack_experts(choice & 16);
  target.set_naming(choice & 32 ? weightstore::v1::TENSOR_NAMING_ENGINE_NATIVE
                                : weightstore::v1::TENSOR_NAMING_CANONICAL);
  return target;
}

void CheckPlan(const weightstore::v1::Manifest& manifest,
               const std::vector<internal::v1::PlannedTensor>& plan) {
  uint64_t shard_total = 0;
  for (const weightstore::v1::Shard& shard : manifest.shards()) shard_total += shard.byte_size();
  if (shard_total > kMaxCheckedBytes) return;
  std::vector<std::string> shards;
  for (const weightstore::v1::Shard& shard : manifest.shards())
    shards.emplace_back(shard.byte_size(), '\x5a');
  const std::vector<absl::string_view> views(shards.begin(), shards.end());
  for (const internal::v1::PlannedTensor& tensor : plan) {
    const uint64_t size = tensor.tensor().byte_size();
    FuzzCheck(size <= shard_total, "a target tensor is no bigger than the shards");
    std::vector<uint8_t> written(size, 0);
    uint64_t previous_dst = 0;
    for (const internal::v1::CopyOp& op : tensor.ops()) {
      FuzzCheck(op.dst_offset() >= previous_dst, "ops ascend by dst_offset");
      previous_dst = op.dst_offset();
      FuzzCheck(op.shard_index() >= 0 && op.shard_index() < manifest.shards_size(), "shard index");
      const uint64_t shard_size = manifest.shards(op.shard_index()).byte_size();
      for (uint64_t block = 0; block < op.count(); ++block) {
        const uint64_t src = op.src_offset() + block * op.src_stride();
        const uint64_t dst = op.dst_offset() + block * op.dst_stride();
        FuzzCheck(src + op.length() <= shard_size, "reads stay inside the shard");
        FuzzCheck(dst + op.length() <= size, "writes stay inside the tensor");
        for (uint64_t i = 0; i < op.length(); ++i) ++written[dst + i];
      }
    }
    for (uint8_t count : written) FuzzCheck(count == 1, "every target byte written exactly once");
    std::string destination(size, '\0');
    ExecuteOps(tensor, views, destination.data());
    FuzzCheck(destination == std::string(size, '\x5a'), "execution copies the planned bytes");
  }
}

}  // namespace
}  // namespace tandem::weight_store

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::weight_store;
  if (size < 1) return 0;
  const absl::string_view file(reinterpret_cast<const char*>(data) + 1, size - 1);
  tandem::weightstore::v1::Manifest manifest;
  if (!tandem::DecodeChecksummed("TMAN", file, manifest).ok()) return 0;
  if (!ValidateManifest(manifest).ok()) return 0;
  absl::StatusOr<std::vector<tandem::internal::v1::PlannedTensor>> plan =
      PlanReads(manifest, LayoutFrom(data[0]), {});
  if (plan.ok()) CheckPlan(manifest, *plan);
  return 0;
}
