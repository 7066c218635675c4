#ifndef TANDEM_SERVICES_TRAINER_RANK_WORKER_H_
#define TANDEM_SERVICES_TRAINER_RANK_WORKER_H_

#include <atomic>
#include <memory>
#include <thread>

#include "absl/time/time.h"
#include "services/trainer/job/job_run.h"
#include "tandem/internal/v1/trainer_ranks.grpc.pb.h"

namespace tandem::trainer {

// A trainer of rank > 0: asks rank 0 (TrainerRanksService.GetAssignment) for a job to join every
// `poll_interval`, runs its part of each job it is given (RunJobRank), then asks again. A rank
// that restarts asks again and joins rank 0's next run. Runs on a thread of its own until
// destroyed (which stops a running job at its next phase).
class RankWorker {
 public:
  RankWorker(int rank, std::unique_ptr<internal::v1::TrainerRanksService::StubInterface> rank_zero,
             JobEnvironment environment, absl::Duration poll_interval = absl::Milliseconds(500));
  ~RankWorker();

  RankWorker(const RankWorker&) = delete;
  RankWorker& operator=(const RankWorker&) = delete;

 private:
  void Loop();
  // Rank 0's assignment for this rank, if it has one.
  absl::StatusOr<internal::v1::GetAssignmentResponse> Ask();

  const int rank_;
  const std::unique_ptr<internal::v1::TrainerRanksService::StubInterface> rank_zero_;
  const JobEnvironment environment_;
  const absl::Duration poll_interval_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_RANK_WORKER_H_
