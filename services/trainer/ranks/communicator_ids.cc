#include "services/trainer/ranks/communicator_ids.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::trainer {
namespace {

constexpr size_t kMaxGroupBytes = 128;

absl::Status CheckGroup(const std::string& group) {
  if (group.empty() || group.size() > kMaxGroupBytes) {
    return InvalidField("group", absl::StrCat("group name has ", group.size(),
                                              " bytes; allowed 1..", kMaxGroupBytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CommunicatorIds::Publish(const std::string& group, int world_size,
                                      const std::string& id) {
  if (absl::Status status = CheckGroup(group); !status.ok()) return status;
  if (world_size < 2 || id.empty()) {
    return InvalidRequest("COMMUNICATOR_MISUSE",
                          absl::StrCat("group ", group, ": world size ", world_size,
                                       " (>= 2) and a non-empty id are needed"));
  }
  absl::MutexLock lock(&mutex_);
  auto [it, inserted] = groups_.try_emplace(group, Group{world_size, id});
  if (!inserted && (it->second.world_size != world_size || it->second.id != id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("group ", group, " is already published with another id or size"));
  }
  return absl::OkStatus();
}

void CommunicatorIds::Withdraw(const std::string& group) {
  absl::MutexLock lock(&mutex_);
  groups_.erase(group);
}

absl::StatusOr<std::string> CommunicatorIds::Get(const std::string& group, int rank,
                                                 int world_size) const {
  if (absl::Status status = CheckGroup(group); !status.ok()) return status;
  if (world_size < 2 || rank < 1 || rank >= world_size) {
    return InvalidField(world_size < 2 ? "world_size" : "rank",
                        absl::StrCat("rank ", rank, " of ", world_size,
                                     " ranks: askers are ranks 1..world_size-1"));
  }
  absl::MutexLock lock(&mutex_);
  auto it = groups_.find(group);
  if (it == groups_.end()) {
    return absl::NotFoundError(absl::StrCat("group ", group, " is not published (yet)"));
  }
  if (it->second.world_size != world_size) {
    return absl::FailedPreconditionError(
        absl::StrCat("group ", group, " has ", it->second.world_size, " ranks, not ", world_size));
  }
  return it->second.id;
}

}  // namespace tandem::trainer
