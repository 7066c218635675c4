#ifndef TANDEM_SERVICES_TRAINER_RENDEZVOUS_VALUES_H_
#define TANDEM_SERVICES_TRAINER_RENDEZVOUS_VALUES_H_

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace tandem::trainer {

// The rendezvous keys of the groups whose rank 0 this trainer is: CPU ranks publish their
// addresses here and read each other's (over TrainerRanksService) to form a Gloo group.
// Bounded: groups are named 1..128 bytes, keys 1..256 bytes, values up to 1 MiB, a group holds at
// most 65536 keys. Thread-safe.
class RendezvousValues {
 public:
  // Sets (or replaces) `key` of `group`.
  absl::Status Set(const std::string& group, const std::string& key, std::string value);
  // NOT_FOUND while the key is unset.
  absl::StatusOr<std::string> Get(const std::string& group, const std::string& key) const;
  // Forgets a group (its job ended).
  void Withdraw(const std::string& group);

 private:
  mutable absl::Mutex mutex_;
  absl::flat_hash_map<std::string, absl::flat_hash_map<std::string, std::string>> groups_
      ABSL_GUARDED_BY(mutex_);
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_RENDEZVOUS_VALUES_H_
