#include "services/weight_store/tensor_fetch.h"

#include "absl/strings/str_cat.h"
#include "common/checksum.h"
#include "common/status.h"
#include "services/weight_store/manifest.h"
#include "services/weight_store/reshard.h"
#include "services/weight_store/tensor_assembly.h"
#include "transfer/dtype_conversion.h"

namespace tandem::weight_store {

absl::StatusOr<TensorFetch> TensorFetch::Start(
    AdapterStore& store, const weightstore::v1::FetchTensorsRequest& request) {
  TensorFetch fetch;
  fetch.chunk_bytes_ =
      request.max_chunk_bytes() == 0 ? kMaxFetchChunkBytes : request.max_chunk_bytes();
  if (fetch.chunk_bytes_ < kMinFetchChunkBytes || fetch.chunk_bytes_ > kMaxFetchChunkBytes) {
    return InvalidField("max_chunk_bytes", absl::StrCat("max_chunk_bytes is ", fetch.chunk_bytes_,
                                                        "; allowed 1 MiB..4 MiB"));
  }
  if (absl::Status status = ValidateVersionOf(request.adapter_name(), request.version());
      !status.ok()) {
    return status;
  }
  if (!request.has_target()) {
    return InvalidField("target", "target is required (an empty TargetLayout is one rank)");
  }
  absl::StatusOr<std::shared_ptr<const CommittedVersion>> version =
      store.Find(request.adapter_name(), request.version(), 0);
  if (!version.ok()) return version.status();
  fetch.version_ = *std::move(version);
  absl::StatusOr<std::vector<internal::v1::PlannedTensor>> plan =
      PlanReads(fetch.version_->manifest, request.target(),
                {request.tensor_names().begin(), request.tensor_names().end()});
  if (!plan.ok()) return plan.status();
  fetch.plan_ = *std::move(plan);
  fetch.target_dtype_ = request.target().dtype();
  // Refused before the first chunk rather than partway through the stream.
  for (const internal::v1::PlannedTensor& planned : fetch.plan_) {
    if (absl::Status convertible =
            transfer::CheckConvertible(planned.tensor().spec().dtype(), fetch.target_dtype_);
        !convertible.ok()) {
      return InvalidField("target.dtype",
                          absl::StrCat("target.dtype: tensor ", planned.tensor().spec().name(),
                                       ": ", convertible.message()));
    }
  }
  return fetch;
}

absl::StatusOr<TensorFetch::Tensor> TensorFetch::Next() {
  const internal::v1::PlannedTensor& planned = plan_[next_++];
  absl::StatusOr<std::string> bytes = transfer::ConvertFloats(
      AssembleTensor(planned, *version_), planned.tensor().spec().dtype(), target_dtype_);
  if (!bytes.ok()) return bytes.status();
  Tensor tensor{.header = planned.tensor(), .bytes = *std::move(bytes)};
  if (target_dtype_ != type::v1::DTYPE_UNSPECIFIED) {
    tensor.header.mutable_spec()->set_dtype(target_dtype_);
  }
  tensor.header.set_byte_size(tensor.bytes.size());
  tensor.header.set_xxh3_64(Xxh3Checksum(tensor.bytes));
  return tensor;
}

}  // namespace tandem::weight_store
