#include "services/trainer/ranks/rendezvous_values.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/string_limits.h"

namespace tandem::trainer {
namespace {

constexpr size_t kMaxGroupBytes = 128;
constexpr size_t kMaxKeyBytes = 256;
constexpr size_t kMaxValueBytes = size_t{1} << 20;
constexpr size_t kMaxKeysPerGroup = 65536;

absl::Status CheckName(const char* field, const std::string& name, size_t max_bytes) {
  if (name.empty()) return InvalidField(field, absl::StrCat(field, " is required"));
  return CheckMaxBytes(field, name, max_bytes);
}

absl::Status CheckGroupAndKey(const std::string& group, const std::string& key) {
  if (absl::Status status = CheckName("group", group, kMaxGroupBytes); !status.ok()) {
    return status;
  }
  return CheckName("key", key, kMaxKeyBytes);
}

}  // namespace

absl::Status RendezvousValues::Set(const std::string& group, const std::string& key,
                                   std::string value) {
  if (absl::Status status = CheckGroupAndKey(group, key); !status.ok()) return status;
  if (absl::Status status = CheckMaxBytes("value", value, kMaxValueBytes); !status.ok()) {
    return status;
  }
  absl::MutexLock lock(&mutex_);
  auto& keys = groups_[group];
  if (keys.size() >= kMaxKeysPerGroup && !keys.contains(key)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("group ", group, " holds ", keys.size(), " keys already"));
  }
  keys[key] = std::move(value);
  return absl::OkStatus();
}

absl::StatusOr<std::string> RendezvousValues::Get(const std::string& group,
                                                  const std::string& key) const {
  if (absl::Status status = CheckGroupAndKey(group, key); !status.ok()) return status;
  absl::MutexLock lock(&mutex_);
  auto found_group = groups_.find(group);
  if (found_group != groups_.end()) {
    auto found = found_group->second.find(key);
    if (found != found_group->second.end()) return found->second;
  }
  return absl::NotFoundError(absl::StrCat("group ", group, " has no key ", key, " (yet)"));
}

void RendezvousValues::Withdraw(const std::string& group) {
  absl::MutexLock lock(&mutex_);
  groups_.erase(group);
}

}  // namespace tandem::trainer
