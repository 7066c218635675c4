#include "common/communicator.h"

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

absl::Status CheckCounts(const char* what, absl::Span<const int64_t> counts, int size) {
  if (static_cast<int64_t>(counts.size()) != size) {
    return absl::InvalidArgumentError(
        absl::StrCat("AllToAllV: ", what, " has ", counts.size(), " counts for ", size, " ranks"));
  }
  for (size_t r = 0; r < counts.size(); ++r) {
    if (counts[r] < 0) {
      return absl::InvalidArgumentError(
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

}  // namespace tandem
