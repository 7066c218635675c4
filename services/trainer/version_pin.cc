#include "services/trainer/version_pin.h"

#include "common/channel.h"
#include "common/logging.h"
#include "common/status.h"

namespace tandem::trainer {

std::unique_ptr<VersionPin> VersionPin::Take(v1::WeightStoreService::StubInterface& store,
                                             const std::string& adapter, int64_t version,
                                             const std::string& holder, absl::Duration ttl) {
  v1::AcquireLeaseRequest request;
  request.set_adapter_name(adapter);
  request.set_version(version);
  request.set_holder(holder);
  request.set_ttl_seconds(absl::ToDoubleSeconds(ttl));
  v1::AcquireLeaseResponse response;
  grpc::ClientContext context;
  SetTimeout(context, absl::Seconds(10));
  const absl::Status status = FromGrpcStatus(store.AcquireLease(&context, request, &response));
  if (!status.ok()) {
    spdlog::warn("trainer: cannot pin {}@{} for its generation ({}); generating unpinned", adapter,
                 version, status);
    return nullptr;
  }
  return std::unique_ptr<VersionPin>(new VersionPin(store, response.lease_id()));
}

VersionPin::~VersionPin() {
  v1::ReleaseLeaseRequest request;
  request.set_lease_id(lease_id_);
  v1::ReleaseLeaseResponse response;
  grpc::ClientContext context;
  SetTimeout(context, absl::Seconds(10));
  store_.ReleaseLease(&context, request, &response);  // A failure leaves it to its TTL.
}

}  // namespace tandem::trainer
