#ifndef TANDEM_SERVICES_TRAINER_DATA_PARALLEL_SHARE_H_
#define TANDEM_SERVICES_TRAINER_DATA_PARALLEL_SHARE_H_

#include <vector>

#include "absl/status/statusor.h"

namespace tandem::trainer {

// The samples data-parallel rank `rank` of `ranks` trains in a step of `groups` groups of
// `group_size` samples each (group-major, as generated), updated in `updates` mini-batches of
// contiguous groups: whole groups only (GRPO's group statistics stay on one rank), and from
// every mini-batch the same contiguous share, so the ranks' mini-batch u together are exactly the
// one-rank mini-batch u and the ranks update in lockstep. Ascending sample indices.
// INVALID_ARGUMENT unless `updates` divides `groups` and each mini-batch has a group for every
// rank, or for a rank outside [0, ranks).
absl::StatusOr<std::vector<int>> DataParallelShare(int groups, int group_size, int updates,
                                                   int ranks, int rank);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_DATA_PARALLEL_SHARE_H_
