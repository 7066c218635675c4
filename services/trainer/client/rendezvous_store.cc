#include "services/trainer/client/rendezvous_store.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "services/trainer/client/await_rank_zero.h"

namespace tandem::trainer {
void RendezvousStore::set(const std::string& key, const std::vector<char>& data) {
  internal::v1::SetRendezvousValueRequest request;
  request.set_group(group_);
  request.set_key(key);
  request.set_value(std::string(data.begin(), data.end()));
  internal::v1::SetRendezvousValueResponse response;
  const absl::Status status =
      AwaitRankZero(absl::Now() + timeout(), [&](grpc::ClientContext& context) {
        return stub_.SetRendezvousValue(&context, request, &response);
      });
  if (!status.ok()) Fail(group_, key, status);
}

std::vector<char> RendezvousStore::Get(const std::string& key, absl::Time deadline) {
  internal::v1::GetRendezvousValueRequest request;
  request.set_group(group_);
  request.set_key(key);
  internal::v1::GetRendezvousValueResponse response;
  const absl::Status status = AwaitRankZero(deadline, [&](grpc::ClientContext& context) {
    return stub_.GetRendezvousValue(&context, request, &response);
  });
  if (!status.ok()) Fail(group_, key, status);
  return std::vector<char>(response.value().begin(), response.value().end());
}

}  // namespace tandem::trainer
