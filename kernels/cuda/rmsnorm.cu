#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/rmsnorm.h"

namespace tandem::cuda {
namespace {

// One block per row: a block-wide sum of squares, then the scaled row.
__global__ void RmsNormKernel(const float* __restrict__ x, const float* __restrict__ weight,
                              float* __restrict__ y, float* __restrict__ rstd, int dim, float eps) {
  __shared__ float scratch[32];
  const float* row = x + int64_t{blockIdx.x} * dim;
  float sum_sq = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) sum_sq += row[i] * row[i];
  sum_sq = BlockSum(sum_sq, scratch);
  const float s = rsqrtf(sum_sq / dim + eps);
  float* out = y + int64_t{blockIdx.x} * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) out[i] = row[i] * s * weight[i];
  if (rstd != nullptr && threadIdx.x == 0) rstd[blockIdx.x] = s;
}

// dx_i += s w_i dy_i - x_i s³ / dim · Σ_j dy_j w_j x_j, one block per row.
__global__ void RmsNormDxKernel(const float* __restrict__ x, const float* __restrict__ weight,
                                const float* __restrict__ rstd, const float* __restrict__ dy,
                                float* __restrict__ dx, int dim) {
  __shared__ float scratch[32];
  const int64_t offset = int64_t{blockIdx.x} * dim;
  float dot = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    dot += dy[offset + i] * weight[i] * x[offset + i];
  }
  dot = BlockSum(dot, scratch);
  const float s = rstd[blockIdx.x];
  const float coeff = dot * s * s * s / dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    dx[offset + i] += s * weight[i] * dy[offset + i] - x[offset + i] * coeff;
  }
}

constexpr int kRowsPerChunk = 64;

// dweight_i += Σ_r dy_ri x_ri s_r. Threads own columns (coalesced); blockIdx.y takes chunks of
// rows (striding by gridDim.y chunks), whose partial sums are added atomically, so tall inputs
// still fill the GPU.
__global__ void RmsNormDweightKernel(const float* __restrict__ x, const float* __restrict__ rstd,
                                     const float* __restrict__ dy, float* __restrict__ dweight,
                                     int rows, int dim) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= dim) return;
  float sum = 0.0f;
  for (int first = blockIdx.y * kRowsPerChunk; first < rows; first += gridDim.y * kRowsPerChunk) {
    const int last = min(rows, first + kRowsPerChunk);
    for (int r = first; r < last; ++r) {
      const int64_t at = int64_t{r} * dim + i;
      sum += dy[at] * x[at] * rstd[r];
    }
  }
  atomicAdd(&dweight[i], sum);
}

}  // namespace

absl::Status RmsNorm(const float* x, const float* weight, float* y, float* rstd, int rows, int dim,
                     float eps, Stream stream) {
  if (rows == 0 || dim == 0) return absl::OkStatus();
  RmsNormKernel<<<rows, kThreadsPerBlock, 0, stream>>>(x, weight, y, rstd, dim, eps);
  return LaunchStatus("RmsNorm");
}

absl::Status RmsNormBackward(const float* x, const float* weight, const float* rstd,
                             const float* dy, float* dx, float* dweight, int rows, int dim,
                             Stream stream) {
  if (rows == 0 || dim == 0) return absl::OkStatus();
  if (dweight != nullptr) {
    const int chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
    const dim3 grid((dim + kThreadsPerBlock - 1) / kThreadsPerBlock,
                    chunks < 65535 ? chunks : 65535);
    RmsNormDweightKernel<<<grid, kThreadsPerBlock, 0, stream>>>(x, rstd, dy, dweight, rows, dim);
    if (absl::Status status = LaunchStatus("RmsNormBackward (dweight)"); !status.ok()) {
      return status;
    }
  }
  if (dx == nullptr) return absl::OkStatus();
  RmsNormDxKernel<<<rows, kThreadsPerBlock, 0, stream>>>(x, weight, rstd, dy, dx, dim);
  return LaunchStatus("RmsNormBackward (dx)");
}

}  // namespace tandem::cuda
