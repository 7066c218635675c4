#include "common/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/launch.cuh"

namespace tandem {
namespace {

using ::tandem::cuda::CudaStatus;

absl::Status NcclStatus(ncclResult_t result, absl::string_view what) {
  if (result == ncclSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", ncclGetErrorString(result)));
}

absl::Status RequireGpu(int device) { return cuda::SelectDevice(device).status(); }

}  // namespace

struct NcclCommunicator::Handles {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  float* barrier_value = nullptr;  // One float on the device: a barrier is an all-reduce of it.
  ~Handles() {
    if (comm != nullptr) ncclCommDestroy(comm);
    if (barrier_value != nullptr) cudaFree(barrier_value);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

absl::StatusOr<std::string> NcclCommunicator::NewNcclUniqueId() {
  if (absl::Status status = RequireGpu(0); !status.ok()) return status;
  ncclUniqueId id;
  if (absl::Status status = NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"); !status.ok()) {
    return status;
  }
  return std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    absl::string_view unique_id, int rank, int size, int device) {
  if (unique_id.size() != sizeof(ncclUniqueId::internal)) {
    return InvalidRequest("COMMUNICATOR_MISUSE",
                          absl::StrCat("NCCL unique id has ", unique_id.size(), " bytes; expected ",
                                       sizeof(ncclUniqueId::internal)));
  }
  if (size < 1 || rank < 0 || rank >= size) {
    return InvalidRequest("COMMUNICATOR_MISUSE", absl::StrCat("rank ", rank, " of ", size,
                                                              " ranks: need 0 <= rank < size"));
  }
  if (absl::Status status = RequireGpu(device); !status.ok()) return status;
  ncclUniqueId id;
  std::copy(unique_id.begin(), unique_id.end(), id.internal);
  auto handles = std::make_unique<Handles>();
  // A blocking stream: it waits for the default stream, where the engine's kernels, copies and
  // frees run, so a collective sees the gradients those kernels wrote.
  if (absl::Status status = CudaStatus(cudaStreamCreate(&handles->stream), "cudaStreamCreate");
      !status.ok()) {
    return status;
  }
  if (absl::Status status =
          CudaStatus(cudaMalloc(&handles->barrier_value, sizeof(float)), "cudaMalloc (barrier)");
      !status.ok()) {
    return status;
  }
  if (absl::Status status =
          NcclStatus(ncclCommInitRank(&handles->comm, size, id, rank), "ncclCommInitRank");
      !status.ok()) {
    handles->comm = nullptr;
    return status;
  }
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(std::move(handles), rank, size));
}

NcclCommunicator::NcclCommunicator(std::unique_ptr<Handles> handles, int rank, int size)
    : handles_(std::move(handles)), rank_(rank), size_(size) {}

NcclCommunicator::~NcclCommunicator() = default;

absl::Status NcclCommunicator::AllReduceSum(float* data, int64_t count) {
  if (count == 0) return absl::OkStatus();
  if (absl::Status status = NcclStatus(
          ncclAllReduce(data, data, count, ncclFloat32, ncclSum, handles_->comm, handles_->stream),
          "ncclAllReduce");
      !status.ok()) {
    return status;
  }
  return CudaStatus(cudaStreamSynchronize(handles_->stream), "ncclAllReduce (wait)");
}

absl::Status NcclCommunicator::Broadcast(float* data, int64_t count, int root) {
  if (root < 0 || root >= size_) {
    return InvalidRequest("COMMUNICATOR_MISUSE",
                          absl::StrCat("broadcast root ", root, " outside [0, ", size_, ")"));
  }
  if (count == 0) return absl::OkStatus();
  if (absl::Status status = NcclStatus(
          ncclBroadcast(data, data, count, ncclFloat32, root, handles_->comm, handles_->stream),
          "ncclBroadcast");
      !status.ok()) {
    return status;
  }
  return CudaStatus(cudaStreamSynchronize(handles_->stream), "ncclBroadcast (wait)");
}

absl::Status NcclCommunicator::Barrier() {
  return AllReduceSum(handles_->barrier_value, 1);
}

absl::Status NcclCommunicator::AllToAllV(const float* send, absl::Span<const int64_t> send_counts,
                                         float* receive,
                                         absl::Span<const int64_t> receive_counts) {
  if (absl::Status status = ValidateAllToAllVCounts(send_counts, receive_counts, size_);
      !status.ok()) {
    return status;
  }
  // Point-to-point sends and receives in one group: NCCL's own all-to-all-v.
  if (absl::Status status = NcclStatus(ncclGroupStart(), "ncclGroupStart"); !status.ok()) {
    return status;
  }
  int64_t sent = 0, received = 0;
  for (int r = 0; r < size_; ++r) {
    if (send_counts[r] > 0) {
      if (absl::Status status = NcclStatus(ncclSend(send + sent, send_counts[r], ncclFloat32, r,
                                                    handles_->comm, handles_->stream),
                                           "ncclSend");
          !status.ok()) {
        ncclGroupEnd();
        return status;
      }
    }
    if (receive_counts[r] > 0) {
      if (absl::Status status = NcclStatus(ncclRecv(receive + received, receive_counts[r],
                                                    ncclFloat32, r, handles_->comm,
                                                    handles_->stream),
                                           "ncclRecv");
          !status.ok()) {
        ncclGroupEnd();
        return status;
      }
    }
    sent += send_counts[r];
    received += receive_counts[r];
  }
  if (absl::Status status = NcclStatus(ncclGroupEnd(), "ncclGroupEnd"); !status.ok()) {
    return status;
  }
  return CudaStatus(cudaStreamSynchronize(handles_->stream), "all-to-all-v (wait)");
}

}  // namespace tandem
