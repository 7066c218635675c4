#ifndef TANDEM_SERVICES_TRAINER_RANK_ROSTER_H_
#define TANDEM_SERVICES_TRAINER_RANK_ROSTER_H_

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tandem/internal/v1/trainer_ranks.pb.h"

namespace tandem::trainer {

// Rank 0's record of the trainer deployment's other ranks (1..ranks-1): the job run each is to
// join, posted by rank 0's run of a multi-rank job, and whether the rank took it (asked for it
// over TrainerRanksService.GetAssignment). Thread-safe.
class RankRoster {
 public:
  explicit RankRoster(int ranks) : assignments_(ranks) {}

  int ranks() const { return static_cast<int>(assignments_.size()); }

  // Posts `assignment` (its group, job, start) for ranks 1..members-1, each with its own
  // data_parallel_rank, replacing what they had. INVALID_ARGUMENT unless 1 <= members <= ranks().
  absl::Status Post(const internal::v1::GetAssignmentResponse& assignment, int members);
  // Rank `rank`'s assignment, which it takes by asking. INVALID_ARGUMENT for a rank outside
  // [1, ranks()); NOT_FOUND while it has none.
  absl::StatusOr<internal::v1::GetAssignmentResponse> Take(int rank);
  // Returns once ranks 1..members-1 have taken `group`'s assignment. Until then calls
  // `on_waiting` with the ranks missing (once, then on every change); DEADLINE_EXCEEDED naming
  // them when `deadline` passes, CANCELLED once `cancelled` is seen.
  absl::Status AwaitJoined(const std::string& group, int members, absl::Time deadline,
                           const std::atomic<bool>& cancelled,
                           const std::function<void(const std::string& waiting)>& on_waiting);
  // Withdraws `group`'s assignments (its run ended); ranks that took them find nothing new.
  void Withdraw(const std::string& group);

 private:
  struct Assignment {
    internal::v1::GetAssignmentResponse response;  // Group empty: none.
    bool taken = false;
  };
  // Ranks among 1..members-1 that have not taken `group`'s assignment.
  std::vector<int> Missing(const std::string& group, int members) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  mutable absl::Mutex mutex_;
  std::vector<Assignment> assignments_ ABSL_GUARDED_BY(mutex_);  // [0] unused: rank 0 posts.
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_RANK_ROSTER_H_
