#include "services/trainer/ranks/local_rendezvous_store.h"

#include <algorithm>

namespace tandem::trainer {
namespace {

// How often a read of a key not set yet looks again: the other ranks set theirs over the network.
constexpr absl::Duration kPollInterval = absl::Milliseconds(5);

}  // namespace

void LocalRendezvousStore::set(const std::string& key, const std::vector<char>& data) {
  if (absl::Status status = values_.Set(group_, key, std::string(data.begin(), data.end()));
      !status.ok()) {
    Fail(group_, key, status);
  }
}

std::vector<char> LocalRendezvousStore::Get(const std::string& key, absl::Time deadline) {
  while (true) {
    absl::StatusOr<std::string> value = values_.Get(group_, key);
    if (value.ok()) return std::vector<char>(value->begin(), value->end());
    if (!absl::IsNotFound(value.status()) || absl::Now() >= deadline) {
      Fail(group_, key, value.status());
    }
    absl::SleepFor(std::min(kPollInterval, deadline - absl::Now()));
  }
}

}  // namespace tandem::trainer
