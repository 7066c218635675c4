#ifndef TANDEM_COMMON_COMMUNICATOR_H_
#define TANDEM_COMMON_COMMUNICATOR_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace tandem {

// Collective operations among the trainer's ranks: gradients are summed with AllReduceSum after
// each backward, parameters sent from one rank with Broadcast (at start and after a checkpoint
// load), tokens exchanged with AllToAllV at an expert-parallel MoE block's dispatch and combine.
// Calls are collective: every rank makes the same calls in the same order with matching counts.
// Where the buffers live (host or device memory) is the implementation's to say; Gloo
// (gloo_communicator.h) serves CPU ranks, NCCL (nccl_communicator.h) GPU ranks.
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data[i] <- Σ over ranks of data[i], on every rank; returns once the result is in place.
  virtual absl::Status AllReduceSum(float* data, int64_t count) = 0;
  // AllReduceSum where ranks meet after long work of their own (a step's phase boundary: one
  // may still be generating, or riding out a store outage): waits up to `wait` for the others
  // where the implementation bounds single calls (Gloo), and like AllReduceSum elsewhere.
  virtual absl::Status AllReduceSumAwaiting(float* data, int64_t count, absl::Duration wait) {
    return AllReduceSum(data, count);
  }
  // data <- root's data on every rank; INVALID_ARGUMENT for a root outside [0, size()).
  virtual absl::Status Broadcast(float* data, int64_t count, int root) = 0;
  // Returns once every rank has called it.
  virtual absl::Status Barrier() = 0;
  // Sends send_counts[r] values to each rank r, in rank order from `send`, and receives
  // receive_counts[r] values from each rank r, in rank order into `receive`. What rank a sends
  // rank b must be what b expects from a. INVALID_ARGUMENT unless both spans have size()
  // counts, none negative.
  virtual absl::Status AllToAllV(const float* send, absl::Span<const int64_t> send_counts,
                                 float* receive, absl::Span<const int64_t> receive_counts) = 0;
};

// The payload a communicator puts on the status of a collective that failed because its group
// broke (a peer died, stalled or could not be reached): the group is unusable, and forming a new
// one may succeed.
inline constexpr char kBrokenGroupPayload[] = "type.tandem.dev/tandem.BrokenGroup";
// `status` with kBrokenGroupPayload set.
absl::Status MarkBrokenGroup(absl::Status status);
bool IsBrokenGroup(const absl::Status& status);

// AllToAllV's argument rule, for every implementation: `size` counts in each span, none
// negative; INVALID_ARGUMENT naming the span and rank otherwise.
absl::Status ValidateAllToAllVCounts(absl::Span<const int64_t> send_counts,
                                     absl::Span<const int64_t> receive_counts, int size);

// Built on a communicator's operations, for the small values ranks exchange beside tensors.
// Host buffers only (a CPU group).

// Every rank's `mine` (the same count on every rank), rank-major: [r * mine.size() + i] is rank
// r's mine[i]. Values must be floats that sum exactly with zeros (any float does). With `wait`,
// the ranks meet after long work of their own (AllReduceSumAwaiting).
absl::StatusOr<std::vector<float>> GatherFromRanks(
    Communicator& ranks, absl::Span<const float> mine,
    std::optional<absl::Duration> wait = std::nullopt);
// `bytes` <- root's bytes on every rank (any length; other ranks' contents are replaced).
absl::Status BroadcastBytes(Communicator& ranks, std::string& bytes, int root);

}  // namespace tandem

#endif  // TANDEM_COMMON_COMMUNICATOR_H_
