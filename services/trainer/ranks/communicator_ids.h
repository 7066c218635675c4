#ifndef TANDEM_SERVICES_TRAINER_COMMUNICATOR_IDS_H_
#define TANDEM_SERVICES_TRAINER_COMMUNICATOR_IDS_H_

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace tandem::trainer {

// The communicator ids of the data-parallel groups this trainer leads as rank 0, which the
// other ranks fetch over TrainerRanksService (common/nccl_communicator.h makes the ids and
// consumes them). Thread-safe.
class CommunicatorIds {
 public:
  // INVALID_ARGUMENT for a group name outside 1..128 bytes, world_size < 2 or an empty id;
  // ALREADY_EXISTS if the group is published with another id or size (publishing the same
  // again is fine).
  absl::Status Publish(const std::string& group, int world_size, const std::string& id);
  // Ends a group (its job finished); later askers get NOT_FOUND.
  void Withdraw(const std::string& group);

  // The id for `rank` of `group`: NOT_FOUND while unpublished; INVALID_ARGUMENT for a bad name
  // or a rank outside [1, world_size); FAILED_PRECONDITION when world_size differs from the
  // published one.
  absl::StatusOr<std::string> Get(const std::string& group, int rank, int world_size) const;

 private:
  struct Group {
    int world_size = 0;
    std::string id;
  };
  mutable absl::Mutex mutex_;
  absl::flat_hash_map<std::string, Group> groups_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_COMMUNICATOR_IDS_H_
