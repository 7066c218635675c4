#ifndef TANDEM_SERVICES_TRAINER_JOB_RUN_RANKS_H_
#define TANDEM_SERVICES_TRAINER_JOB_RUN_RANKS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/counting_communicator.h"
#include "common/gloo_communicator.h"
#include "engine/expert_parallel_exchange.h"
#include "gloo/rendezvous/store.h"
#include "placement/expert_placement.h"
#include "services/trainer/ranks/rank_group.h"
#include "services/trainer/update/policy_update_config.h"
#include "tandem/internal/v1/trainer_ranks.pb.h"

namespace tandem::trainer {

// Where one run of a job sits among the job's trainer ranks: rank 0, which leads (posts the job,
// forms the group, owns checkpoints and progress), or a rank > 0 with the assignment rank 0
// posted; once the ranks joined, their groups and, expert parallel, the MoE blocks' exchange
// over this rank's expert group.
class RunRanks {
 public:
  // Rank 0's `retry`-th run of an attempt (each forms a group of its own) when `assignment` is
  // null; else the rank it names, joining through `member_store` (rank 0's rendezvous values).
  // Neither is owned.
  RunRanks(const internal::v1::GetAssignmentResponse* assignment,
           gloo::rendezvous::Store* member_store, int retry)
      : assignment_(assignment),
        member_store_(member_store),
        rank_(assignment != nullptr ? assignment->data_parallel_rank() : 0),
        retry_(retry) {}

  bool lead() const { return assignment_ == nullptr; }
  int rank() const { return rank_; }
  int retry() const { return retry_; }
  // What rank 0 posted; only for a rank > 0.
  const internal::v1::GetAssignmentResponse& assignment() const { return *assignment_; }

  // Forms the groups of `ranks` ranks: rank 0 posts `to_post` to the others through `meeting`
  // and waits until they joined (RankGroup::Lead); a rank > 0 joins rank 0's.
  absl::Status Form(const internal::v1::GetAssignmentResponse& to_post, int ranks,
                    int expert_parallel, const RankMeeting& meeting,
                    const std::atomic<bool>& cancelled);
  // Expert parallel, once formed: the exchange over the expert group, for `model`'s MoE layers,
  // each with the contiguous placement; returns the experts this rank computes in each.
  absl::StatusOr<std::vector<int>> ExchangeExperts(const engine::ModelConfig& model);

  // The job's ranks once they formed a group; null for one rank.
  CountingCommunicator* ranks() { return group_ == nullptr ? nullptr : &group_->ranks(); }
  // Null without expert parallelism (and before it is formed).
  CountingCommunicator* experts() { return group_ == nullptr ? nullptr : group_->experts(); }
  CountingCommunicator* copies() { return group_ == nullptr ? nullptr : group_->copies(); }
  engine::ExpertParallelExchange* exchange() { return exchange_.get(); }
  // The experts' placements over each expert group; null without expert parallelism.
  const placement::LayerPlacements* Placements() const {
    return exchange_ == nullptr ? nullptr : &exchange_->placements();
  }
  PolicyUpdateConfig::ExpertParallelism ExpertGroups();

  // What the expert exchange has done since the run began (zeros without one).
  struct ExchangeTotals {
    double seconds = 0;
    int64_t bytes = 0;
    int64_t rows = 0;
    double compute_seconds = 0;
  };
  ExchangeTotals Exchanged();

  // Between phases of a step with several ranks: every rank learns whether any failed `what`
  // (`local` as is for one rank).
  absl::Status Agree(const absl::Status& local, absl::string_view what, absl::Duration timeout);

 private:
  const internal::v1::GetAssignmentResponse* const assignment_;  // Null on rank 0.
  gloo::rendezvous::Store* const member_store_;                  // Rank 0's values, for a rank > 0.
  const int rank_;
  const int retry_;
  std::unique_ptr<RankGroup> group_;
  std::unique_ptr<engine::ExpertParallelExchange> exchange_;
  absl::Duration exchange_time_;  // In the expert group's collectives, since the run began.
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_JOB_RUN_RANKS_H_
