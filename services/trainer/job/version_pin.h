#ifndef TANDEM_SERVICES_TRAINER_VERSION_PIN_H_
#define TANDEM_SERVICES_TRAINER_VERSION_PIN_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "services/weight_store/client/adapter_client.h"

namespace tandem::trainer {

// A weight-store lease on one adapter version, held while a generation that asks rollout for
// that version exactly may still need it: a replica that restarts mid-generation loads the
// version again, and the store otherwise keeps only its newest versions (--keep_versions), which
// an ASYNC job publishing ahead can push it out of. Released when the pin goes.
class VersionPin {
 public:
  // Best effort: nullptr (logged) if the lease cannot be taken; the generation then runs
  // unpinned, as it would have anyway.
  static std::unique_ptr<VersionPin> Take(const weight_store::WeightStoreStubs& store,
                                          const std::string& adapter, int64_t version,
                                          const std::string& holder, absl::Duration ttl);
  ~VersionPin();

  VersionPin(const VersionPin&) = delete;
  VersionPin& operator=(const VersionPin&) = delete;

 private:
  VersionPin(const weight_store::WeightStoreStubs& store, std::string lease_id)
      : store_(store), lease_id_(std::move(lease_id)) {}

  const weight_store::WeightStoreStubs& store_;
  const std::string lease_id_;
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_VERSION_PIN_H_
