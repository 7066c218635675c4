#include "kernels/cuda/embedding.h"
#include "kernels/cuda/launch.cuh"

namespace tandem::cuda {
namespace {

// One block per row; threads stride along the row, so reads and writes coalesce.
__global__ void GatherKernel(const float* __restrict__ table, const int* __restrict__ ids,
                             float* __restrict__ out, int dim) {
  const float* source = table + int64_t{ids[blockIdx.x]} * dim;
  float* target = out + int64_t{blockIdx.x} * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) target[i] = source[i];
}

__global__ void ScatterAddKernel(const float* __restrict__ dout, const int* __restrict__ ids,
                                 float* __restrict__ dtable, int dim) {
  const float* source = dout + int64_t{blockIdx.x} * dim;
  float* target = dtable + int64_t{ids[blockIdx.x]} * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) atomicAdd(&target[i], source[i]);
}

}  // namespace

absl::Status EmbeddingGather(const float* table, const int* ids, float* out, int rows, int dim,
                             Stream stream) {
  if (rows == 0 || dim == 0) return absl::OkStatus();
  GatherKernel<<<rows, kThreadsPerBlock, 0, stream>>>(table, ids, out, dim);
  return LaunchStatus("EmbeddingGather");
}

absl::Status EmbeddingBackward(const float* dout, const int* ids, float* dtable, int rows, int dim,
                               Stream stream) {
  if (rows == 0 || dim == 0) return absl::OkStatus();
  ScatterAddKernel<<<rows, kThreadsPerBlock, 0, stream>>>(dout, ids, dtable, dim);
  return LaunchStatus("EmbeddingBackward");
}

}  // namespace tandem::cuda
