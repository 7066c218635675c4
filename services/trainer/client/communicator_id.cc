#include "services/trainer/client/communicator_id.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "grpcpp/client_context.h"

namespace tandem::trainer {

absl::StatusOr<std::string> FetchCommunicatorId(v1::TrainerRanksService::StubInterface& stub,
                                                const std::string& group, int rank, int world_size,
                                                absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  v1::GetCommunicatorIdRequest request;
  request.set_group(group);
  request.set_rank(rank);
  request.set_world_size(world_size);
  absl::Duration backoff = absl::Milliseconds(10);
  absl::Status last;
  while (true) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    v1::GetCommunicatorIdResponse response;
    last = FromGrpcStatus(stub.GetCommunicatorId(&context, request, &response));
    if (last.ok()) return response.communicator_id();
    if (!absl::IsNotFound(last) && !absl::IsUnavailable(last)) return last;
    if (absl::Now() + backoff >= deadline) break;
    absl::SleepFor(backoff);
    backoff = std::min(2 * backoff, absl::Milliseconds(500));
  }
  return absl::DeadlineExceededError(absl::StrCat("no communicator id for group ", group,
                                                  " within ", absl::FormatDuration(timeout),
                                                  "; last answer: ", last.ToString()));
}

}  // namespace tandem::trainer
