#ifndef TANDEM_SERVICES_TRAINER_CLIENT_AWAIT_RANK_ZERO_H_
#define TANDEM_SERVICES_TRAINER_CLIENT_AWAIT_RANK_ZERO_H_

#include <functional>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"

namespace tandem::trainer {

// Calls `call` (a TrainerRanksService RPC, with its context's deadline set) with backoff while
// rank 0 has not published what is asked for yet (NOT_FOUND) or cannot be reached (UNAVAILABLE),
// until `deadline`; returns the first other answer, or the last one once the deadline passes.
absl::Status AwaitRankZero(absl::Time deadline,
                           const std::function<grpc::Status(grpc::ClientContext&)>& call);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_CLIENT_AWAIT_RANK_ZERO_H_
