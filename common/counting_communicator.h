#ifndef TANDEM_COMMON_COUNTING_COMMUNICATOR_H_
#define TANDEM_COMMON_COUNTING_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/time/time.h"
#include "common/communicator.h"

namespace tandem {

// A Communicator that forwards every call to another and counts what passes through it: the
// time spent inside collectives (waiting for slower ranks included) and the bytes this rank
// handed to them (an all-reduce's or broadcast's buffer, an all-to-all's send counts). For a
// step's metrics; not thread-safe, like the communicators it wraps.
class CountingCommunicator final : public Communicator {
 public:
  explicit CountingCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}

  struct Counts {
    absl::Duration time;
    int64_t bytes = 0;
  };
  // What was counted since the last call.
  Counts TakeCounts() { return std::exchange(counts_, Counts()); }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  absl::Status AllReduceSum(float* data, int64_t count) override;
  absl::Status AllReduceSumAwaiting(float* data, int64_t count, absl::Duration wait) override;
  absl::Status Broadcast(float* data, int64_t count, int root) override;
  absl::Status Barrier() override;
  absl::Status AllToAllV(const float* send, absl::Span<const int64_t> send_counts, float* receive,
                         absl::Span<const int64_t> receive_counts) override;

 private:
  template <typename Call>
  absl::Status Counted(int64_t floats, Call&& call);

  const std::unique_ptr<Communicator> inner_;
  Counts counts_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_COUNTING_COMMUNICATOR_H_
