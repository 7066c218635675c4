#ifndef TANDEM_SERVICES_TRAINER_CLIENT_COMMUNICATOR_ID_H_
#define TANDEM_SERVICES_TRAINER_CLIENT_COMMUNICATOR_ID_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tandem/internal/v1/trainer_ranks.grpc.pb.h"

namespace tandem::trainer {

// Asks rank 0's trainer (`stub`) for the communicator id of `group`, as rank `rank` of
// `world_size`. Retries with backoff while rank 0 has not published the group yet (NOT_FOUND)
// or cannot be reached (UNAVAILABLE), up to `timeout`, then DEADLINE_EXCEEDED naming the last
// answer; any other error returns at once.
absl::StatusOr<std::string> FetchCommunicatorId(
    internal::v1::TrainerRanksService::StubInterface& stub, const std::string& group, int rank,
    int world_size, absl::Duration timeout);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_CLIENT_COMMUNICATOR_ID_H_
