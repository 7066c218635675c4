#include "common/counting_communicator.h"

#include <numeric>

namespace tandem {

template <typename Call>
absl::Status CountingCommunicator::Counted(int64_t floats, Call&& call) {
  const absl::Time start = absl::Now();
  absl::Status status = call();
  counts_.time += absl::Now() - start;
  counts_.bytes += floats * static_cast<int64_t>(sizeof(float));
  return status;
}

absl::Status CountingCommunicator::AllReduceSum(float* data, int64_t count) {
  return Counted(count, [&] { return inner_->AllReduceSum(data, count); });
}

absl::Status CountingCommunicator::AllReduceSumAwaiting(float* data, int64_t count,
                                                        absl::Duration wait) {
  return Counted(count, [&] { return inner_->AllReduceSumAwaiting(data, count, wait); });
}

absl::Status CountingCommunicator::Broadcast(float* data, int64_t count, int root) {
  return Counted(count, [&] { return inner_->Broadcast(data, count, root); });
}

absl::Status CountingCommunicator::Barrier() {
  return Counted(0, [&] { return inner_->Barrier(); });
}

absl::Status CountingCommunicator::AllToAllV(const float* send,
                                             absl::Span<const int64_t> send_counts, float* receive,
                                             absl::Span<const int64_t> receive_counts) {
  const int64_t sent = std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0});
  return Counted(sent,
                 [&] { return inner_->AllToAllV(send, send_counts, receive, receive_counts); });
}

}  // namespace tandem
