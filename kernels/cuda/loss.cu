#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/loss.h"

namespace tandem::cuda {
namespace {

constexpr int kLossThreads = 512;  // Vocabularies are wide: more threads per row pay off.

// log Σ exp(x_j) over one row, computed by the whole block; every thread gets the result.
__device__ float RowLogSumExp(const float* x, int vocab, float* scratch) {
  float max = -INFINITY;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) max = fmaxf(max, x[j]);
  max = BlockMax(max, scratch);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) sum += expf(x[j] - max);
  return max + logf(BlockSum(sum, scratch));
}

__global__ void LogSoftmaxKernel(const float* __restrict__ logits, float* __restrict__ logp,
                                 int vocab) {
  __shared__ float scratch[32];
  const float* x = logits + int64_t{blockIdx.x} * vocab;
  float* y = logp + int64_t{blockIdx.x} * vocab;
  const float lse = RowLogSumExp(x, vocab, scratch);
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) y[j] = x[j] - lse;
}

__global__ void TokenLogProbsKernel(const float* __restrict__ logits,
                                    const int* __restrict__ targets, float* __restrict__ out,
                                    float* __restrict__ lse, int vocab) {
  __shared__ float scratch[32];
  const float* x = logits + int64_t{blockIdx.x} * vocab;
  const float row_lse = RowLogSumExp(x, vocab, scratch);
  if (threadIdx.x != 0) return;
  out[blockIdx.x] = x[targets[blockIdx.x]] - row_lse;
  if (lse != nullptr) lse[blockIdx.x] = row_lse;
}

__global__ void TokenLogProbsBackwardKernel(const float* __restrict__ logits,
                                            const int* __restrict__ targets,
                                            const float* __restrict__ dlogprob,
                                            float* __restrict__ dlogits, int vocab) {
  __shared__ float scratch[32];
  const float g = dlogprob[blockIdx.x];
  if (g == 0.0f) return;  // The whole block leaves together: no barrier is skipped by some.
  const float* x = logits + int64_t{blockIdx.x} * vocab;
  float* dx = dlogits + int64_t{blockIdx.x} * vocab;
  const float row_lse = RowLogSumExp(x, vocab, scratch);
  const int target = targets[blockIdx.x];
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
    dx[j] += (j == target ? g : 0.0f) - g * expf(x[j] - row_lse);
  }
}

// log(exp(a) + exp(b)), exact when either is −inf (nothing folded in yet).
__device__ float AddLogSumExps(float a, float b) {
  if (a == -INFINITY) return b;
  if (b == -INFINITY) return a;
  const float high = fmaxf(a, b);
  return high + log1pf(expf(fminf(a, b) - high));
}

__global__ void FoldLogSumExpKernel(const float* __restrict__ logits,
                                    const int* __restrict__ targets, float* __restrict__ lse,
                                    float* __restrict__ target_logit, int first_column, int width) {
  __shared__ float scratch[32];
  const float* x = logits + int64_t{blockIdx.x} * width;
  const float chunk_lse = RowLogSumExp(x, width, scratch);
  if (threadIdx.x != 0) return;
  lse[blockIdx.x] = AddLogSumExps(lse[blockIdx.x], chunk_lse);
  const int column = targets[blockIdx.x] - first_column;
  if (column >= 0 && column < width) target_logit[blockIdx.x] = x[column];
}

__global__ void TokenLogProbsChunkBackwardKernel(const float* __restrict__ logits,
                                                 const int* __restrict__ targets,
                                                 const float* __restrict__ lse,
                                                 const float* __restrict__ dlogprob,
                                                 float* __restrict__ dlogits, int first_column,
                                                 int width) {
  const float g = dlogprob[blockIdx.x];
  const float row_lse = lse[blockIdx.x];
  const int column = targets[blockIdx.x] - first_column;
  const float* x = logits + int64_t{blockIdx.x} * width;
  float* dx = dlogits + int64_t{blockIdx.x} * width;
  for (int j = threadIdx.x; j < width; j += blockDim.x) {
    dx[j] = g == 0.0f ? 0.0f : (j == column ? g : 0.0f) - g * expf(x[j] - row_lse);
  }
}

}  // namespace

absl::Status LogSoftmax(const float* logits, float* logp, int rows, int vocab, Stream stream) {
  if (rows == 0) return absl::OkStatus();
  LogSoftmaxKernel<<<rows, kLossThreads, 0, stream>>>(logits, logp, vocab);
  return LaunchStatus("LogSoftmax");
}

absl::Status TokenLogProbs(const float* logits, const int* targets, float* out, float* lse,
                           int rows, int vocab, Stream stream) {
  if (rows == 0) return absl::OkStatus();
  TokenLogProbsKernel<<<rows, kLossThreads, 0, stream>>>(logits, targets, out, lse, vocab);
  return LaunchStatus("TokenLogProbs");
}

absl::Status TokenLogProbsBackward(const float* logits, const int* targets, const float* dlogprob,
                                   float* dlogits, int rows, int vocab, Stream stream) {
  if (rows == 0) return absl::OkStatus();
  TokenLogProbsBackwardKernel<<<rows, kLossThreads, 0, stream>>>(logits, targets, dlogprob, dlogits,
                                                                 vocab);
  return LaunchStatus("TokenLogProbsBackward");
}

absl::Status FoldLogSumExp(const float* logits, const int* targets, float* lse, float* target_logit,
                           int rows, int first_column, int width, Stream stream) {
  if (rows == 0) return absl::OkStatus();
  FoldLogSumExpKernel<<<rows, kLossThreads, 0, stream>>>(logits, targets, lse, target_logit,
                                                         first_column, width);
  return LaunchStatus("FoldLogSumExp");
}

absl::Status TokenLogProbsChunkBackward(const float* logits, const int* targets, const float* lse,
                                        const float* dlogprob, float* dlogits, int rows,
                                        int first_column, int width, Stream stream) {
  if (rows == 0) return absl::OkStatus();
  TokenLogProbsChunkBackwardKernel<<<rows, kLossThreads, 0, stream>>>(
      logits, targets, lse, dlogprob, dlogits, first_column, width);
  return LaunchStatus("TokenLogProbsChunkBackward");
}

}  // namespace tandem::cuda
