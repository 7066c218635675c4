#include "services/trainer/job/version_pin.h"

#include "common/logging.h"
#include "services/weight_store/client/adapter_client.h"

namespace tandem::trainer {

std::unique_ptr<VersionPin> VersionPin::Take(const weight_store::WeightStoreStubs& store,
                                             const std::string& adapter, int64_t version,
                                             const std::string& holder, absl::Duration ttl) {
  absl::StatusOr<std::string> lease =
      weight_store::AcquireLease(store, adapter, version, holder, ttl);
  if (!lease.ok()) {
    spdlog::warn("trainer: cannot pin {}@{} for its generation ({}); generating unpinned", adapter,
                 version, lease.status());
    return nullptr;
  }
  return std::unique_ptr<VersionPin>(new VersionPin(store, *std::move(lease)));
}

VersionPin::~VersionPin() { weight_store::ReleaseLease(store_, lease_id_); }

}  // namespace tandem::trainer
