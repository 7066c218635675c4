#include "kernels/cuda/attention.h"
#include "kernels/cuda/launch.cuh"

namespace tandem::cuda {
namespace {

constexpr int kWarp = 32;

// Row strides of the token-major layouts.
struct Strides {
  int q, k, v, out;
  __host__ __device__ static Strides Of(const kernels::AttentionShape& s) {
    return {s.heads * s.qk_dim, s.kv_heads * s.qk_dim, s.kv_heads * s.v_dim, s.heads * s.v_dim};
  }
};

// row[j] = alpha · a · b_j for j < n, where b_j starts at b + j * b_stride; a warp per j, lanes
// across the dot product, so the reads of b coalesce.
__device__ void WarpDots(const float* a, const float* b, int b_stride, int n, int width,
                         float alpha, float* row) {
  const int lane = threadIdx.x % kWarp;
  const int warps = blockDim.x / kWarp;
  for (int j = threadIdx.x / kWarp; j < n; j += warps) {
    const float* bj = b + int64_t{j} * b_stride;
    float dot = 0.0f;
    for (int c = lane; c < width; c += kWarp) dot += a[c] * bj[c];
    dot = WarpSum(dot);
    if (lane == 0) row[j] = alpha * dot;
  }
}

// out[c] += alpha · Σ_{j<n} w[j] · m[j * m_stride + c], threads across c (coalesced).
__device__ void WeightedRowSum(const float* w, const float* m, int m_stride, int n, int width,
                               float alpha, float* out, bool accumulate) {
  for (int c = threadIdx.x; c < width; c += blockDim.x) {
    float sum = 0.0f;
    for (int j = 0; j < n; ++j) sum += w[j] * m[int64_t{j} * m_stride + c];
    out[c] = (accumulate ? out[c] : 0.0f) + alpha * sum;
  }
}

// Softmax of row[0..n) in place (the block cooperates), zeros in row[n..width).
__device__ void SoftmaxRow(float* row, int n, int width, float* scratch) {
  __syncthreads();  // The dots written by other warps are visible.
  float max = -INFINITY;
  for (int j = threadIdx.x; j < n; j += blockDim.x) max = fmaxf(max, row[j]);
  max = BlockMax(max, scratch);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const float e = expf(row[j] - max);
    row[j] = e;
    sum += e;
  }
  const float inv = 1.0f / BlockSum(sum, scratch);
  for (int j = threadIdx.x; j < width; j += blockDim.x) row[j] = j < n ? row[j] * inv : 0.0f;
  __syncthreads();
}

// One query row of head h over n keys: scores into row[0..n) (zeros up to `width`), softmax,
// then out = Σ_j row[j] v_j. The whole block cooperates.
__device__ void AttendRow(const float* query, const float* keys, const float* values, int n,
                          int width, int h, const kernels::AttentionShape& s, float* row,
                          float* out) {
  __shared__ float scratch[32];
  const int kv = h / (s.heads / s.kv_heads);
  const Strides stride = Strides::Of(s);
  WarpDots(query, keys + kv * s.qk_dim, stride.k, n, s.qk_dim, s.scale, row);
  SoftmaxRow(row, n, width, scratch);
  WeightedRowSum(row, values + kv * s.v_dim, stride.v, n, s.v_dim, 1.0f, out, false);
}

// Block (t, h) of the forward: query t against keys 0..t, probabilities kept in probs.
__global__ void ForwardKernel(const float* __restrict__ q, const float* __restrict__ k,
                              const float* __restrict__ v, float* __restrict__ out,
                              float* __restrict__ probs, int T, kernels::AttentionShape s) {
  const int t = blockIdx.x, h = blockIdx.y;
  const Strides stride = Strides::Of(s);
  AttendRow(q + int64_t{t} * stride.q + h * s.qk_dim, k, v, t + 1, T, h, s,
            probs + (int64_t{h} * T + t) * T, out + int64_t{t} * stride.out + h * s.v_dim);
}

// Block h of the decode: the forward's row for the last position, scores in `scores`.
__global__ void DecodeKernel(const float* __restrict__ q, const float* __restrict__ k_cache,
                             const float* __restrict__ v_cache, int len, float* __restrict__ out,
                             kernels::AttentionShape s, float* __restrict__ scores) {
  const int h = blockIdx.x;
  AttendRow(q + h * s.qk_dim, k_cache, v_cache, len, len, h, s, scores + int64_t{h} * len,
            out + h * s.v_dim);
}

// Block (h, r): row r's decode over its own cache; scores in its own slice of `scores`.
__global__ void BatchedDecodeKernel(const float* __restrict__ q, const float* const* k_caches,
                                    const float* const* v_caches, const int* __restrict__ lens,
                                    int max_len, float* __restrict__ out, kernels::AttentionShape s,
                                    float* __restrict__ scores) {
  const int h = blockIdx.x, r = blockIdx.y;
  const int64_t q_width = int64_t{s.heads} * s.qk_dim, out_width = int64_t{s.heads} * s.v_dim;
  AttendRow(q + r * q_width + h * s.qk_dim, k_caches[r], v_caches[r], lens[r], lens[r], h, s,
            scores + (int64_t{r} * s.heads + h) * max_len, out + r * out_width + h * s.v_dim);
}

// Block r copies row r's key and value into its cache.
__global__ void AppendKernel(const float* __restrict__ k, const float* __restrict__ v,
                             float* const* k_caches, float* const* v_caches,
                             const int* __restrict__ positions, int key_width, int value_width) {
  const int r = blockIdx.x;
  const int64_t position = positions[r];
  for (int c = threadIdx.x; c < key_width; c += blockDim.x) {
    k_caches[r][position * key_width + c] = k[int64_t{r} * key_width + c];
  }
  for (int c = threadIdx.x; c < value_width; c += blockDim.x) {
    v_caches[r][position * value_width + c] = v[int64_t{r} * value_width + c];
  }
}

// Block (t, h) of the backward: dS row = P ∘ (dP - rowsum(P ∘ dP)) with dP = dout · v, zeros
// above the diagonal; then dq[t, h] += scale · Σ_j dS_j k_j.
__global__ void ScoreGradientKernel(const float* __restrict__ q, const float* __restrict__ k,
                                    const float* __restrict__ v, const float* __restrict__ probs,
                                    const float* __restrict__ dout, float* __restrict__ dq,
                                    float* __restrict__ ds, int T, kernels::AttentionShape s) {
  __shared__ float scratch[32];
  const int t = blockIdx.x, h = blockIdx.y;
  const int kv = h / (s.heads / s.kv_heads);
  const Strides stride = Strides::Of(s);
  const int64_t row_offset = (int64_t{h} * T + t) * T;
  const float* p = probs + row_offset;
  float* row = ds + row_offset;
  WarpDots(dout + int64_t{t} * stride.out + h * s.v_dim, v + kv * s.v_dim, stride.v, t + 1, s.v_dim,
           1.0f, row);
  __syncthreads();
  float dot = 0.0f;
  for (int j = threadIdx.x; j <= t; j += blockDim.x) dot += p[j] * row[j];
  dot = BlockSum(dot, scratch);
  for (int j = threadIdx.x; j < T; j += blockDim.x) row[j] = j <= t ? p[j] * (row[j] - dot) : 0.0f;
  __syncthreads();
  if (dq == nullptr) return;
  WeightedRowSum(row, k + kv * s.qk_dim, stride.k, t + 1, s.qk_dim, s.scale,
                 dq + int64_t{t} * stride.q + h * s.qk_dim, true);
}

// Block (j, kv) of the backward: sums over the group's query heads and the queries t >= j that
// see key j: dk[j] += scale · Σ dS[h, t, j] q[t, h]; dv[j] += Σ P[h, t, j] dout[t, h].
__global__ void KeyValueGradientKernel(const float* __restrict__ q, const float* __restrict__ probs,
                                       const float* __restrict__ dout, const float* __restrict__ ds,
                                       float* __restrict__ dk, float* __restrict__ dv, int T,
                                       kernels::AttentionShape s) {
  const int j = blockIdx.x, kv = blockIdx.y;
  const int group = s.heads / s.kv_heads;
  const Strides stride = Strides::Of(s);
  if (dk != nullptr) {
    for (int c = threadIdx.x; c < s.qk_dim; c += blockDim.x) {
      float sum = 0.0f;
      for (int h = kv * group; h < (kv + 1) * group; ++h) {
        for (int t = j; t < T; ++t) {
          sum += ds[(int64_t{h} * T + t) * T + j] * q[int64_t{t} * stride.q + h * s.qk_dim + c];
        }
      }
      dk[int64_t{j} * stride.k + kv * s.qk_dim + c] += s.scale * sum;
    }
  }
  if (dv == nullptr) return;
  for (int c = threadIdx.x; c < s.v_dim; c += blockDim.x) {
    float sum = 0.0f;
    for (int h = kv * group; h < (kv + 1) * group; ++h) {
      for (int t = j; t < T; ++t) {
        sum +=
            probs[(int64_t{h} * T + t) * T + j] * dout[int64_t{t} * stride.out + h * s.v_dim + c];
      }
    }
    dv[int64_t{j} * stride.v + kv * s.v_dim + c] += sum;
  }
}

absl::Status CheckShape(const kernels::AttentionShape& s) {
  if (s.heads < 1 || s.kv_heads < 1 || s.heads % s.kv_heads != 0 || s.qk_dim < 1 || s.v_dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attention shape: ", s.heads, " heads over ", s.kv_heads, " key/value heads, widths ",
        s.qk_dim, "/", s.v_dim, " (heads must be a multiple of key/value heads, widths >= 1)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CausalAttention(const float* q, const float* k, const float* v, float* out,
                             float* probs, int T, const kernels::AttentionShape& shape,
                             Stream stream) {
  if (absl::Status status = CheckShape(shape); !status.ok()) return status;
  if (T == 0) return absl::OkStatus();
  ForwardKernel<<<dim3(T, shape.heads), kThreadsPerBlock, 0, stream>>>(q, k, v, out, probs, T,
                                                                       shape);
  return LaunchStatus("CausalAttention");
}

int64_t AttentionBackwardWorkspaceFloats(int T, const kernels::AttentionShape& shape) {
  return int64_t{shape.heads} * T * T;
}

absl::Status CausalAttentionBackward(const float* q, const float* k, const float* v,
                                     const float* probs, const float* dout, float* dq, float* dk,
                                     float* dv, int T, const kernels::AttentionShape& shape,
                                     float* workspace, Stream stream) {
  if (absl::Status status = CheckShape(shape); !status.ok()) return status;
  if (T == 0 || (dq == nullptr && dk == nullptr && dv == nullptr)) return absl::OkStatus();
  ScoreGradientKernel<<<dim3(T, shape.heads), kThreadsPerBlock, 0, stream>>>(
      q, k, v, probs, dout, dq, workspace, T, shape);
  if (absl::Status status = LaunchStatus("CausalAttentionBackward (scores)"); !status.ok()) {
    return status;
  }
  if (dk == nullptr && dv == nullptr) return absl::OkStatus();
  KeyValueGradientKernel<<<dim3(T, shape.kv_heads), kThreadsPerBlock, 0, stream>>>(
      q, probs, dout, workspace, dk, dv, T, shape);
  return LaunchStatus("CausalAttentionBackward (keys, values)");
}

absl::Status DecodeAttention(const float* q, const float* k_cache, const float* v_cache, int len,
                             float* out, const kernels::AttentionShape& shape, float* scratch,
                             Stream stream) {
  if (absl::Status status = CheckShape(shape); !status.ok()) return status;
  if (len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode attention over ", len, " cached tokens; needs at least 1"));
  }
  DecodeKernel<<<shape.heads, kThreadsPerBlock, 0, stream>>>(q, k_cache, v_cache, len, out, shape,
                                                             scratch);
  return LaunchStatus("DecodeAttention");
}

absl::Status BatchedDecodeAttention(const float* q, const float* const* k_caches,
                                    const float* const* v_caches, const int* lens, int rows,
                                    int max_len, float* out, const kernels::AttentionShape& shape,
                                    float* scratch, Stream stream) {
  if (absl::Status status = CheckShape(shape); !status.ok()) return status;
  if (max_len < 1 || rows > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("batched decode of ", rows,
                                                   " rows (at most 65535) over caches of up to ",
                                                   max_len, " positions (at least 1)"));
  }
  if (rows == 0) return absl::OkStatus();
  BatchedDecodeKernel<<<dim3(shape.heads, rows), kThreadsPerBlock, 0, stream>>>(
      q, k_caches, v_caches, lens, max_len, out, shape, scratch);
  return LaunchStatus("BatchedDecodeAttention");
}

absl::Status AppendToCaches(const float* k, const float* v, float* const* k_caches,
                            float* const* v_caches, const int* positions, int rows, int key_width,
                            int value_width, Stream stream) {
  if (rows == 0) return absl::OkStatus();
  AppendKernel<<<rows, kThreadsPerBlock, 0, stream>>>(k, v, k_caches, v_caches, positions,
                                                      key_width, value_width);
  return LaunchStatus("AppendToCaches");
}

}  // namespace tandem::cuda
