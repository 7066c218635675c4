#include "common/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <utility>

#include "absl/strings/str_cat.h"
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
  ~Handles() {
    if (comm != nullptr) ncclCommDestroy(comm);
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
    return absl::InvalidArgumentError(absl::StrCat("NCCL unique id has ", unique_id.size(),
                                                   " bytes; expected ",
                                                   sizeof(ncclUniqueId::internal)));
  }
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " of ", size, " ranks: need 0 <= rank < size"));
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
    return absl::InvalidArgumentError(
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

}  // namespace tandem
