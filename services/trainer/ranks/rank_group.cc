#include "services/trainer/ranks/rank_group.h"

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "gloo/rendezvous/prefix_store.h"
#include "services/trainer/ranks/local_rendezvous_store.h"

namespace tandem::trainer {

absl::StatusOr<std::unique_ptr<RankGroup>> RankGroup::Lead(
    const internal::v1::GetAssignmentResponse& assignment, int ranks, int expert_parallel,
    const RankMeeting& meeting, const std::atomic<bool>& cancelled) {
  RankRoster* roster = meeting.roster;
  if (roster == nullptr || meeting.rendezvous == nullptr || roster->ranks() < ranks) {
    return absl::FailedPreconditionError(
        absl::StrCat("the job asks for ", ranks, " trainer ranks; this trainer deployment has ",
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
  std::unique_ptr<RankGroup> formed(new RankGroup(meeting.rendezvous, group));
  std::move(withdraw_values).Cancel();  // The group's destructor withdraws them.
  if (absl::Status status = formed->Form(store, 0, ranks, expert_parallel, meeting.gloo);
      !status.ok()) {
    return status;
  }
  return formed;
}

absl::StatusOr<std::unique_ptr<RankGroup>> RankGroup::Join(gloo::rendezvous::Store& store, int rank,
                                                           int ranks, int expert_parallel,
                                                           const GlooOptions& gloo) {
  std::unique_ptr<RankGroup> joined(new RankGroup(/*posted=*/nullptr, ""));
  if (absl::Status status = joined->Form(store, rank, ranks, expert_parallel, gloo); !status.ok()) {
    return status;
  }
  return joined;
}

absl::Status RankGroup::Form(gloo::rendezvous::Store& store, int rank, int ranks,
                             int expert_parallel, const GlooOptions& gloo) {
  const auto form = [&](gloo::rendezvous::Store& on, int member, int members,
                        std::unique_ptr<CountingCommunicator>& group) -> absl::Status {
    auto formed = GlooCommunicator::Create(on, member, members, gloo);
    if (!formed.ok()) return formed.status();
    group = std::make_unique<CountingCommunicator>(*std::move(formed));
    return absl::OkStatus();
  };
  if (absl::Status status = form(store, rank, ranks, ranks_); !status.ok()) return status;
  if (expert_parallel == 1) return absl::OkStatus();
  // Every rank forms its two groups in the same order, each under its own keys.
  const int index = rank / expert_parallel, expert_rank = rank % expert_parallel;
  gloo::rendezvous::PrefixStore experts(absl::StrCat("experts", index), store);
  if (absl::Status status = form(experts, expert_rank, expert_parallel, experts_); !status.ok()) {
    return status;
  }
  gloo::rendezvous::PrefixStore copies(absl::StrCat("copies", expert_rank), store);
  return form(copies, index, ranks / expert_parallel, copies_);
}

RankGroup::~RankGroup() {
  if (posted_ != nullptr) posted_->Withdraw(group_);
}

}  // namespace tandem::trainer
