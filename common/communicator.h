#ifndef TANDEM_COMMON_COMMUNICATOR_H_
#define TANDEM_COMMON_COMMUNICATOR_H_

#include <cstdint>

#include "absl/status/status.h"

namespace tandem {

// Collective operations among the trainer's data-parallel ranks: gradients are summed with
// AllReduceSum after each backward, parameters sent from one rank with Broadcast (at start and
// after a checkpoint load). Calls are collective: every rank makes the same calls in the same
// order with the same counts. Where the buffers live (host or device memory) is the
// implementation's to say.
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data[i] <- Σ over ranks of data[i], on every rank; returns once the result is in place.
  virtual absl::Status AllReduceSum(float* data, int64_t count) = 0;
  // data <- root's data on every rank; INVALID_ARGUMENT for a root outside [0, size()).
  virtual absl::Status Broadcast(float* data, int64_t count, int root) = 0;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_COMMUNICATOR_H_
