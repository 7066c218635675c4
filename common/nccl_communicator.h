#ifndef TANDEM_COMMON_NCCL_COMMUNICATOR_H_
#define TANDEM_COMMON_NCCL_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/communicator.h"

namespace tandem {

// A Communicator over NCCL: buffers are device memory on this rank's GPU, and each collective
// runs on the communicator's own stream and is waited for before the call returns.
//
// Bootstrap: rank 0 calls NewNcclUniqueId and hands the bytes to the other ranks over the
// trainer's control plane; every rank then calls Create with them. The id is opaque (128 bytes)
// and only valid while rank 0's process lives.
class NcclCommunicator : public Communicator {
 public:
  // FAILED_PRECONDITION without a GPU (NCCL needs one to create the id's bootstrap socket).
  static absl::StatusOr<std::string> NewNcclUniqueId();

  // Joins the group of `size` ranks as `rank`, on GPU `device`. INVALID_ARGUMENT for an id of
  // the wrong length, a rank outside [0, size) or size < 1; FAILED_PRECONDITION without the GPU;
  // INTERNAL with NCCL's message if joining fails (it blocks until all ranks have joined).
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(absl::string_view unique_id,
                                                                  int rank, int size, int device);

  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllReduceSum(float* data, int64_t count) override;
  absl::Status Broadcast(float* data, int64_t count, int root) override;
  absl::Status Barrier() override;
  absl::Status AllToAllV(const float* send, absl::Span<const int64_t> send_counts, float* receive,
                         absl::Span<const int64_t> receive_counts) override;

 private:
  struct Handles;
  NcclCommunicator(std::unique_ptr<Handles> handles, int rank, int size);

  std::unique_ptr<Handles> handles_;
  int rank_;
  int size_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_NCCL_COMMUNICATOR_H_
