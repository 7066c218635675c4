#include "services/trainer/client/communicator_id.h"

#include "absl/strings/str_cat.h"
#include "services/trainer/client/await_rank_zero.h"

namespace tandem::trainer {

absl::StatusOr<std::string> FetchCommunicatorId(
    internal::v1::TrainerRanksService::StubInterface& stub, const std::string& group, int rank,
    int world_size, absl::Duration timeout) {
  internal::v1::GetCommunicatorIdRequest request;
  request.set_group(group);
  request.set_rank(rank);
  request.set_world_size(world_size);
  internal::v1::GetCommunicatorIdResponse response;
  const absl::Status status =
      AwaitRankZero(absl::Now() + timeout, [&](grpc::ClientContext& context) {
        return stub.GetCommunicatorId(&context, request, &response);
      });
  if (status.ok()) return response.communicator_id();
  if (!absl::IsNotFound(status) && !absl::IsUnavailable(status) &&
      !absl::IsDeadlineExceeded(status)) {
    return status;
  }
  return absl::DeadlineExceededError(absl::StrCat("no communicator id for group ", group,
                                                  " within ", absl::FormatDuration(timeout),
                                                  "; last answer: ", status.ToString()));
}

}  // namespace tandem::trainer
