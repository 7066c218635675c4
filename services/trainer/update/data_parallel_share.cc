#include "services/trainer/update/data_parallel_share.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::trainer {

absl::StatusOr<std::vector<int>> DataParallelShare(int groups, int group_size, int updates,
                                                   int ranks, int rank) {
  if (groups < 1 || group_size < 1 || updates < 1 || groups % updates != 0) {
    return InvalidRequest(
        "BAD_DATA_PARALLEL_SHARE",
        absl::StrCat("data-parallel share: ", updates, " updates must divide ", groups, " groups"));
  }
  if (ranks < 1 || rank < 0 || rank >= ranks) {
    return InvalidRequest(
        "BAD_DATA_PARALLEL_SHARE",
        absl::StrCat("data-parallel share: rank ", rank, " of ", ranks, " is outside [0, ranks)"));
  }
  const int per_update = groups / updates;
  if (per_update < ranks) {
    return InvalidRequest(
        "BAD_DATA_PARALLEL_SHARE",
        absl::StrCat("data-parallel share: a mini-batch of ", per_update, " groups (", groups,
                     " groups, ", updates, " updates) leaves some of the ", ranks,
                     " ranks without a group"));
  }
  std::vector<int> samples;
  for (int update = 0; update < updates; ++update) {
    const int first = update * per_update + per_update * rank / ranks;
    const int end = update * per_update + per_update * (rank + 1) / ranks;
    for (int sample = first * group_size; sample < end * group_size; ++sample) {
      samples.push_back(sample);
    }
  }
  return samples;
}

}  // namespace tandem::trainer
