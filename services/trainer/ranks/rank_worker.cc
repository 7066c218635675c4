#include "services/trainer/ranks/rank_worker.h"

#include <algorithm>
#include <string>

#include "common/channel.h"
#include "common/logging.h"
#include "common/status.h"
#include "services/trainer/client/rendezvous_store.h"

namespace tandem::trainer {

RankWorker::RankWorker(int rank,
                       std::unique_ptr<internal::v1::TrainerRanksService::StubInterface> rank_zero,
                       JobEnvironment environment, absl::Duration poll_interval)
    : rank_(rank),
      rank_zero_(std::move(rank_zero)),
      environment_(std::move(environment)),
      poll_interval_(poll_interval),
      thread_([this] { Loop(); }) {}

RankWorker::~RankWorker() {
  stopping_ = true;
  thread_.join();
}

absl::StatusOr<internal::v1::GetAssignmentResponse> RankWorker::Ask() {
  internal::v1::GetAssignmentRequest request;
  request.set_rank(rank_);
  internal::v1::GetAssignmentResponse response;
  grpc::ClientContext context;
  SetTimeout(context, absl::Seconds(10));
  if (absl::Status status = FromGrpcStatus(rank_zero_->GetAssignment(&context, request, &response));
      !status.ok()) {
    return status;
  }
  return response;
}

void RankWorker::Loop() {
  std::string last_group;  // A run is joined once: rank 0 posts a new group for the next.
  absl::Status last_refusal;
  while (!stopping_) {
    absl::StatusOr<internal::v1::GetAssignmentResponse> assignment = Ask();
    if (assignment.ok() && assignment->group() != last_group) {
      last_group = assignment->group();
      const std::string& job = assignment->job().id();
      spdlog::info("job {}: joining as data-parallel rank {} of {}", job,
                   assignment->data_parallel_rank(),
                   assignment->job().spec().parallelism().data_parallel());
      RendezvousStore store(*rank_zero_, assignment->group(),
                            environment_.settings.rank_join_timeout);
      const absl::Status result = RunJobRank(*assignment, store, environment_, stopping_);
      if (result.ok()) {
        spdlog::info("job {}: this rank's part is done", job);
      } else {
        spdlog::error("job {}: this rank's part failed: {}", job, result.ToString());
      }
      continue;
    }
    // Rank 0 down or restarting, or nothing to join: said once per change, not every poll.
    if (!assignment.ok() && !absl::IsNotFound(assignment.status()) &&
        assignment.status() != last_refusal) {
      spdlog::warn("rank 0 did not answer: {}", assignment.status().ToString());
    }
    last_refusal = assignment.status();
    for (absl::Time until = absl::Now() + poll_interval_; absl::Now() < until && !stopping_;) {
      absl::SleepFor(std::min(until - absl::Now(), absl::Milliseconds(50)));
    }
  }
}

}  // namespace tandem::trainer
