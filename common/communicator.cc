#include "common/communicator.h"

#include <algorithm>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem {
namespace {

absl::Status CheckCounts(const char* what, absl::Span<const int64_t> counts, int size) {
  if (static_cast<int64_t>(counts.size()) != size) {
    return InvalidRequest(
        "COMMUNICATOR_MISUSE",
        absl::StrCat("AllToAllV: ", what, " has ", counts.size(), " counts for ", size, " ranks"));
  }
  for (size_t r = 0; r < counts.size(); ++r) {
    if (counts[r] < 0) {
      return InvalidRequest("COMMUNICATOR_MISUSE",
                            absl::StrCat("AllToAllV: ", what, "[", r, "] is ", counts[r], " < 0"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateAllToAllVCounts(absl::Span<const int64_t> send_counts,
                                     absl::Span<const int64_t> receive_counts, int size) {
  if (absl::Status status = CheckCounts("send_counts", send_counts, size); !status.ok()) {
    return status;
  }
  return CheckCounts("receive_counts", receive_counts, size);
}

absl::Status MarkBrokenGroup(absl::Status status) {
  status.SetPayload(kBrokenGroupPayload, absl::Cord("1"));
  return status;
}

bool IsBrokenGroup(const absl::Status& status) {
  return status.GetPayload(kBrokenGroupPayload).has_value();
}

absl::StatusOr<std::vector<float>> GatherFromRanks(Communicator& ranks,
                                                   absl::Span<const float> mine,
                                                   std::optional<absl::Duration> wait) {
  const size_t count = mine.size();
  std::vector<float> gathered(count * ranks.size(), 0.0f);
  std::copy(mine.begin(), mine.end(), gathered.begin() + count * ranks.rank());
  // Every slot but one is zero on every rank: the sum is each rank's values, exactly.
  const int64_t total = static_cast<int64_t>(gathered.size());
  if (absl::Status status = wait ? ranks.AllReduceSumAwaiting(gathered.data(), total, *wait)
                                 : ranks.AllReduceSum(gathered.data(), total);
      !status.ok()) {
    return status;
  }
  return gathered;
}

absl::Status BroadcastBytes(Communicator& ranks, std::string& bytes, int root) {
  // Floats carry integers below 2^24 exactly: the length (< 16 MiB), then a byte per float.
  float length = static_cast<float>(bytes.size());
  if (ranks.rank() == root && bytes.size() >= (size_t{1} << 24)) {
    return InvalidRequest("COMMUNICATOR_MISUSE",
                          absl::StrCat("BroadcastBytes of ", bytes.size(), " bytes"));
  }
  if (absl::Status status = ranks.Broadcast(&length, 1, root); !status.ok()) return status;
  std::vector<float> values(static_cast<size_t>(length));
  if (ranks.rank() == root) {
    for (size_t i = 0; i < bytes.size(); ++i) values[i] = static_cast<unsigned char>(bytes[i]);
  }
  if (absl::Status status =
          ranks.Broadcast(values.data(), static_cast<int64_t>(values.size()), root);
      !status.ok()) {
    return status;
  }
  bytes.resize(values.size());
  for (size_t i = 0; i < values.size(); ++i)
    bytes[i] = static_cast<char>(static_cast<int>(values[i]));
  return absl::OkStatus();
}

}  // namespace tandem
