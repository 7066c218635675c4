#include "services/trainer/local_rendezvous_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "gloo/common/error.h"

namespace tandem::trainer {
namespace {

// How often a read of a key not set yet looks again: the other ranks set theirs over the network.
constexpr absl::Duration kPollInterval = absl::Milliseconds(5);

[[noreturn]] void Throw(const std::string& group, const std::string& key,
                        const absl::Status& status) {
  throw gloo::IoException(
      absl::StrCat("rendezvous of group ", group, ", key ", key, ": ", status.ToString()));
}

}  // namespace

void LocalRendezvousStore::set(const std::string& key, const std::vector<char>& data) {
  if (absl::Status status = values_.Set(group_, key, std::string(data.begin(), data.end()));
      !status.ok()) {
    Throw(group_, key, status);
  }
}

std::vector<char> LocalRendezvousStore::get(const std::string& key) {
  return Get(key, absl::Now() + timeout_);
}

void LocalRendezvousStore::wait(const std::vector<std::string>& keys) {
  wait(keys, absl::ToChronoMilliseconds(timeout_));
}

void LocalRendezvousStore::wait(const std::vector<std::string>& keys,
                                const std::chrono::milliseconds& timeout) {
  const absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
  for (const std::string& key : keys) Get(key, deadline);
}

std::vector<char> LocalRendezvousStore::Get(const std::string& key, absl::Time deadline) {
  while (true) {
    absl::StatusOr<std::string> value = values_.Get(group_, key);
    if (value.ok()) return std::vector<char>(value->begin(), value->end());
    if (!absl::IsNotFound(value.status()) || absl::Now() >= deadline) {
      Throw(group_, key, value.status());
    }
    absl::SleepFor(std::min(kPollInterval, deadline - absl::Now()));
  }
}

}  // namespace tandem::trainer
