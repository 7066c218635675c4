#include "services/trainer/ranks/rank_roster.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"

namespace tandem::trainer {
namespace {

// How often a wait for ranks looks at the cancel flag.
constexpr absl::Duration kCancelCheckInterval = absl::Milliseconds(100);

std::string WaitingMessage(const std::vector<int>& missing, int members) {
  return absl::StrCat("waiting for trainer ranks ", absl::StrJoin(missing, ", "), " to join (",
                      members - static_cast<int>(missing.size()), " of ", members, " up)");
}

}  // namespace

absl::Status RankRoster::Post(const internal::v1::GetAssignmentResponse& assignment, int members) {
  if (members < 1 || members > ranks()) {
    return InvalidRequest("BAD_RANK_COUNT",
                          absl::StrCat("a job on ", members,
                                       " trainer ranks; this trainer deployment has ", ranks()));
  }
  absl::MutexLock lock(&mutex_);
  for (int rank = 1; rank < members; ++rank) {
    assignments_[rank] = {.response = assignment};
    assignments_[rank].response.set_data_parallel_rank(rank);
  }
  return absl::OkStatus();
}

absl::StatusOr<internal::v1::GetAssignmentResponse> RankRoster::Take(int rank) {
  if (rank < 1 || rank >= ranks()) {
    return InvalidField(
        "rank",
        absl::StrCat("rank ", rank, " is not a joining rank of this trainer deployment (ranks 1..",
                     ranks() - 1, ")"));
  }
  absl::MutexLock lock(&mutex_);
  Assignment& assignment = assignments_[rank];
  if (assignment.response.group().empty()) {
    return absl::NotFoundError(absl::StrCat("no job for trainer rank ", rank, " now"));
  }
  assignment.taken = true;
  return assignment.response;
}

std::vector<int> RankRoster::Missing(const std::string& group, int members) const {
  std::vector<int> missing;
  for (int rank = 1; rank < std::min(members, ranks()); ++rank) {
    const Assignment& assignment = assignments_[rank];
    if (assignment.response.group() != group || !assignment.taken) missing.push_back(rank);
  }
  return missing;
}

absl::Status RankRoster::AwaitJoined(
    const std::string& group, int members, absl::Time deadline, const std::atomic<bool>& cancelled,
    const std::function<void(const std::string& waiting)>& on_waiting) {
  std::vector<int> reported;
  absl::MutexLock lock(&mutex_);
  while (true) {
    const std::vector<int> missing = Missing(group, members);
    if (missing.empty()) return absl::OkStatus();
    if (cancelled) return absl::CancelledError("cancelled while waiting for trainer ranks");
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("trainer ranks ", absl::StrJoin(missing, ", "), " of ", members,
                       " did not join in time (are they running, with --rank0 naming this "
                       "trainer?)"));
    }
    if (missing != reported) {
      reported = missing;
      mutex_.Unlock();
      on_waiting(WaitingMessage(missing, members));
      mutex_.Lock();
      continue;
    }
    const std::vector<int> now = missing;
    auto changed = [&] { return Missing(group, members) != now; };
    mutex_.AwaitWithDeadline(absl::Condition(&changed),
                             std::min(deadline, absl::Now() + kCancelCheckInterval));
  }
}

void RankRoster::Withdraw(const std::string& group) {
  absl::MutexLock lock(&mutex_);
  for (Assignment& assignment : assignments_) {
    if (assignment.response.group() == group) assignment = {};
  }
}

}  // namespace tandem::trainer
