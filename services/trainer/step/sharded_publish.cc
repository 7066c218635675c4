#include "services/trainer/step/sharded_publish.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "services/trainer/ranks/rank_agreement.h"

namespace tandem::trainer {

absl::Status PublishTogether(Communicator& ranks, const weight_store::WeightStoreStubs& stub,
                             const weight_store::AdapterVersion& published,
                             const weight_store::PublishOptions& options,
                             const StoreCall& store_call, absl::Duration wait) {
  const int64_t version = published.manifest.version();
  if (published.manifest.shards_size() != ranks.size()) {
    return absl::InternalError(absl::StrCat("version ", version, " has ",
                                            published.manifest.shards_size(), " shards for ",
                                            ranks.size(), " ranks"));
  }
  const bool lead = ranks.rank() == 0;
  absl::StatusOr<weight_store::Upload> begun;
  absl::Status began = absl::OkStatus();
  if (lead) {
    began = store_call([&] {
      begun = weight_store::BeginUpload(stub, published.manifest, options.ucx != nullptr);
      return begun.status();
    });
  }
  if (absl::Status agreed = AgreeOnFailures(
          ranks, began, absl::StrCat("to begin publishing version ", version), wait);
      !agreed.ok()) {
    return agreed;
  }
  // Where the shards go (the upload id, and UCX targets) goes from rank 0 to the others.
  std::string where = lead ? begun->SerializeAsString() : "";
  if (absl::Status status = BroadcastBytes(ranks, where, /*root=*/0); !status.ok()) {
    if (lead) weight_store::AbortUpload(stub, begun->upload_id());
    return status;
  }
  weight_store::Upload targets;
  if (!targets.ParseFromString(where)) {
    return absl::InternalError(absl::StrCat("version ", version, ": unreadable upload targets"));
  }
  const int own_shard = ranks.rank();
  const absl::Status put =
      weight_store::PutShards(stub, targets, published.shard_views(), {&own_shard, 1}, options);
  if (absl::Status agreed =
          AgreeOnFailures(ranks, put, absl::StrCat("to put its shard of version ", version), wait);
      !agreed.ok()) {
    if (lead) weight_store::AbortUpload(stub, targets.upload_id());
    return agreed;
  }
  absl::Status committed = absl::OkStatus();
  if (lead) {
    committed = store_call(
        [&] { return weight_store::CommitUpload(stub, targets.upload_id(), options).status(); });
    if (!committed.ok()) weight_store::AbortUpload(stub, targets.upload_id());
  }
  return AgreeOnFailures(ranks, committed, absl::StrCat("to commit version ", version), wait);
}

}  // namespace tandem::trainer
