#ifndef TANDEM_COMMON_GLOO_COMMUNICATOR_H_
#define TANDEM_COMMON_GLOO_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/communicator.h"

namespace gloo {
class Context;
namespace rendezvous {
class Store;
}  // namespace rendezvous
}  // namespace gloo

namespace tandem {

struct GlooOptions {
  // The address this rank listens on and its peers connect to: one of its own (loopback on one
  // machine, its namespace's or pod's address in a cluster).
  std::string hostname = "127.0.0.1";
  // Bounds every collective: a peer that is dead or stuck fails the call (UNAVAILABLE) within
  // it, never hangs it (AllReduceSumAwaiting has its own bound).
  absl::Duration timeout = absl::Seconds(60);
  // Bounds joining the group (connecting to every peer once the store names it); unset: timeout.
  std::optional<absl::Duration> join_timeout;
};

// A Communicator over Gloo's TCP transport, for CPU ranks: buffers are host memory. Ranks find
// each other through a Gloo rendezvous store (in a job, the one rank 0's control plane serves;
// a FileStore or HashStore in tests), then connect a full mesh.
//
// After a collective fails (a peer died, or the timeout passed) the group is broken: Gloo's
// pairs are closed, and every later call returns FAILED_PRECONDITION naming the first failure.
// Both, and a group that cannot be formed, carry kBrokenGroupPayload (IsBrokenGroup).
// A job then fails or retries its step with a new communicator.
class GlooCommunicator : public Communicator {
 public:
  // Joins the group of `size` ranks as `rank`, blocking until all have joined (bounded by
  // options.timeout). INVALID_ARGUMENT for a rank outside [0, size) or size < 1; UNAVAILABLE
  // with Gloo's message when the group cannot be formed in time.
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Create(gloo::rendezvous::Store& store,
                                                                  int rank, int size,
                                                                  const GlooOptions& options);

  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllReduceSum(float* data, int64_t count) override;
  absl::Status AllReduceSumAwaiting(float* data, int64_t count, absl::Duration wait) override;
  absl::Status Broadcast(float* data, int64_t count, int root) override;
  absl::Status Barrier() override;
  absl::Status AllToAllV(const float* send, absl::Span<const int64_t> send_counts, float* receive,
                         absl::Span<const int64_t> receive_counts) override;

 private:
  GlooCommunicator(std::shared_ptr<gloo::Context> context, int rank, int size);
  // Runs one collective, turning Gloo's exceptions into a status and a broken group.
  template <typename Operation>
  absl::Status Collective(const char* name, Operation&& operation);
  // AllReduceSum within `timeout`, or the group's own.
  absl::Status AllReduce(const char* name, float* data, int64_t count,
                         std::optional<absl::Duration> timeout);

  std::shared_ptr<gloo::Context> context_;
  int rank_;
  int size_;
  uint32_t next_tag_ = 0;  // Every rank makes the same calls in order, so tags match.
  absl::Status broken_;    // The first failure; OK while the group works.
};

}  // namespace tandem

#endif  // TANDEM_COMMON_GLOO_COMMUNICATOR_H_
