#include "services/trainer/rank_group.h"

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "services/trainer/local_rendezvous_store.h"

namespace tandem::trainer {

absl::StatusOr<std::unique_ptr<RankGroup>> RankGroup::Lead(
    const internal::v1::GetAssignmentResponse& assignment, int ranks, const RankMeeting& meeting,
    const std::atomic<bool>& cancelled) {
  RankRoster* roster = meeting.roster;
  if (roster == nullptr || meeting.rendezvous == nullptr || roster->ranks() < ranks) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job asks for ", ranks, " data-parallel trainer ranks; this trainer deployment has ",
        roster == nullptr ? 1 : roster->ranks(), " (the trainer's --ranks)"));
  }
  const std::string& group = assignment.group();
  if (absl::Status status = roster->Post(assignment, ranks); !status.ok()) return status;
  // Formed or not, a rank that restarts from now on finds nothing to join until the next run.
  const absl::Cleanup withdraw_posting = [&] { roster->Withdraw(group); };
  absl::Cleanup withdraw_values = [&] { meeting.rendezvous->Withdraw(group); };
  const auto say = [&](const std::string& waiting) {
    if (meeting.on_status) meeting.on_status(waiting);
  };
  if (absl::Status status =
          roster->AwaitJoined(group, ranks, absl::Now() + meeting.join_timeout, cancelled, say);
      !status.ok()) {
    return status;
  }
  say("");
  // The others may still be loading the model: joining waits as long as they took to come.
  LocalRendezvousStore store(*meeting.rendezvous, group,
                             meeting.gloo.join_timeout.value_or(meeting.gloo.timeout));
  auto formed = GlooCommunicator::Create(store, 0, ranks, meeting.gloo);
  if (!formed.ok()) return formed.status();
  std::move(withdraw_values).Cancel();  // The group's destructor withdraws them.
  return std::unique_ptr<RankGroup>(new RankGroup(
      std::make_unique<CountingCommunicator>(*std::move(formed)), meeting.rendezvous, group));
}

absl::StatusOr<std::unique_ptr<RankGroup>> RankGroup::Join(gloo::rendezvous::Store& store, int rank,
                                                           int ranks, const GlooOptions& gloo) {
  auto joined = GlooCommunicator::Create(store, rank, ranks, gloo);
  if (!joined.ok()) return joined.status();
  return std::unique_ptr<RankGroup>(new RankGroup(
      std::make_unique<CountingCommunicator>(*std::move(joined)), /*posted=*/nullptr, ""));
}

RankGroup::~RankGroup() {
  if (posted_ != nullptr) posted_->Withdraw(group_);
}

}  // namespace tandem::trainer
