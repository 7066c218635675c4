#ifndef TANDEM_SERVICES_TRAINER_RANK_GROUP_H_
#define TANDEM_SERVICES_TRAINER_RANK_GROUP_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/counting_communicator.h"
#include "common/gloo_communicator.h"
#include "gloo/rendezvous/store.h"
#include "services/trainer/ranks/rank_roster.h"
#include "services/trainer/ranks/rendezvous_values.h"
#include "tandem/internal/v1/trainer_ranks.pb.h"

namespace tandem::trainer {

// Where rank 0 meets the deployment's other trainer ranks.
struct RankMeeting {
  RankRoster* roster = nullptr;            // Null in a deployment of one rank.
  RendezvousValues* rendezvous = nullptr;  // The Gloo values the ranks form groups through.
  GlooOptions gloo;
  absl::Duration join_timeout = absl::Minutes(2);  // For the ranks to join (and load the model).
  // What the lead waits for while ranks have not joined; "" once they have.
  std::function<void(const std::string& waiting)> on_status;
};

// The Gloo groups of one run of a multi-rank job, counting their collectives' bytes and time:
// every rank, and with expert parallelism the rank's expert-parallel group (ranks
// [r - r % ep, r - r % ep + ep), which hold the experts once between them) and its copies (the
// ranks r % ep + i * ep, which hold the same experts).
class RankGroup {
 public:
  // Rank 0: posts `assignment` (its group names the run) for ranks 1..ranks-1 in the roster, waits
  // until they joined, then forms the group with them. FAILED_PRECONDITION when the deployment has
  // fewer ranks; DEADLINE_EXCEEDED naming the missing ranks after join_timeout; CANCELLED once
  // `cancelled` is seen.
  static absl::StatusOr<std::unique_ptr<RankGroup>> Lead(
      const internal::v1::GetAssignmentResponse& assignment, int ranks, int expert_parallel,
      const RankMeeting& meeting, const std::atomic<bool>& cancelled);
  // A rank > 0: joins the groups through rank 0's rendezvous values.
  static absl::StatusOr<std::unique_ptr<RankGroup>> Join(gloo::rendezvous::Store& store, int rank,
                                                         int ranks, int expert_parallel,
                                                         const GlooOptions& gloo);

  // The lead withdraws the run's rendezvous values: its ranks find nothing to join any more.
  ~RankGroup();

  CountingCommunicator& ranks() { return *ranks_; }
  // Null without expert parallelism.
  CountingCommunicator* experts() { return experts_.get(); }
  CountingCommunicator* copies() { return copies_.get(); }

 private:
  RankGroup(RendezvousValues* posted, std::string group)
      : posted_(posted), group_(std::move(group)) {}
  // Forms every group of `rank` through `store`.
  absl::Status Form(gloo::rendezvous::Store& store, int rank, int ranks, int expert_parallel,
                    const GlooOptions& gloo);

  std::unique_ptr<CountingCommunicator> ranks_, experts_, copies_;
  RendezvousValues* const posted_;  // The lead's; null on a rank > 0.
  const std::string group_;
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_RANK_GROUP_H_
