#include "services/trainer/client/rendezvous_store.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "gloo/common/error.h"
#include "services/trainer/client/await_rank_zero.h"

namespace tandem::trainer {
namespace {

[[noreturn]] void Throw(const std::string& group, const std::string& key,
                        const absl::Status& status) {
  throw gloo::IoException(
      absl::StrCat("rendezvous of group ", group, ", key ", key, ": ", status.ToString()));
}

}  // namespace

void RendezvousStore::set(const std::string& key, const std::vector<char>& data) {
  v1::SetRendezvousValueRequest request;
  request.set_group(group_);
  request.set_key(key);
  request.set_value(std::string(data.begin(), data.end()));
  v1::SetRendezvousValueResponse response;
  const absl::Status status =
      AwaitRankZero(absl::Now() + timeout_, [&](grpc::ClientContext& context) {
        return stub_.SetRendezvousValue(&context, request, &response);
      });
  if (!status.ok()) Throw(group_, key, status);
}

std::vector<char> RendezvousStore::get(const std::string& key) {
  return Get(key, absl::Now() + timeout_);
}

void RendezvousStore::wait(const std::vector<std::string>& keys) {
  wait(keys, absl::ToChronoMilliseconds(timeout_));
}

void RendezvousStore::wait(const std::vector<std::string>& keys,
                           const std::chrono::milliseconds& timeout) {
  const absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
  for (const std::string& key : keys) Get(key, deadline);
}

std::vector<char> RendezvousStore::Get(const std::string& key, absl::Time deadline) {
  v1::GetRendezvousValueRequest request;
  request.set_group(group_);
  request.set_key(key);
  v1::GetRendezvousValueResponse response;
  const absl::Status status = AwaitRankZero(deadline, [&](grpc::ClientContext& context) {
    return stub_.GetRendezvousValue(&context, request, &response);
  });
  if (!status.ok()) Throw(group_, key, status);
  return std::vector<char>(response.value().begin(), response.value().end());
}

}  // namespace tandem::trainer
