#include "services/trainer/client/await_rank_zero.h"

#include <algorithm>

#include "common/status.h"

namespace tandem::trainer {

absl::Status AwaitRankZero(absl::Time deadline,
                           const std::function<grpc::Status(grpc::ClientContext&)>& call) {
  absl::Duration backoff = absl::Milliseconds(10);
  while (true) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    const absl::Status status = FromGrpcStatus(call(context));
    if (!absl::IsNotFound(status) && !absl::IsUnavailable(status)) return status;
    if (absl::Now() + backoff >= deadline) return status;
    absl::SleepFor(backoff);
    backoff = std::min(2 * backoff, absl::Milliseconds(500));
  }
}

}  // namespace tandem::trainer
