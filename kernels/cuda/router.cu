#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/router.h"

namespace tandem::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = kThreadsPerBlock / kWarp;
constexpr int kMaxK = 64;
constexpr int kMaxGroups = 64;

__device__ inline float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

unsigned WarpGrid(int T) {
  return static_cast<unsigned>((T + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

// One warp per token: softmax over the row with warp-wide max and sum.
__global__ void SoftmaxScoresKernel(const float* __restrict__ logits, float* __restrict__ scores,
                                    int T, int E) {
  const int t = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp;
  if (t >= T) return;
  const int lane = threadIdx.x % kWarp;
  const float* row = logits + int64_t{t} * E;
  float max = -INFINITY;
  for (int e = lane; e < E; e += kWarp) max = fmaxf(max, row[e]);
  max = WarpMax(max);
  float sum = 0.0f;
  for (int e = lane; e < E; e += kWarp) sum += expf(row[e] - max);
  const float inv = 1.0f / WarpSum(sum);
  float* out = scores + int64_t{t} * E;
  for (int e = lane; e < E; e += kWarp) out[e] = expf(row[e] - max) * inv;
}

__global__ void SigmoidScoresKernel(const float* __restrict__ logits, float* __restrict__ scores,
                                    int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    scores[i] = Sigmoid(logits[i]);
  }
}

// A candidate in the CPU's total order: larger key first, then lower id.
struct Candidate {
  float key;
  int id;
};

__device__ inline bool Better(Candidate a, Candidate b) {
  return a.key > b.key || (a.key == b.key && a.id < b.id);
}

// The best candidate held by any lane of the warp; lanes with none hold id = INT_MAX.
__device__ inline Candidate WarpBest(Candidate mine) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    Candidate other{__shfl_xor_sync(0xffffffff, mine.key, offset),
                    __shfl_xor_sync(0xffffffff, mine.id, offset)};
    if (Better(other, mine)) mine = other;
  }
  return mine;
}

constexpr Candidate kNone{-INFINITY, 0x7fffffff};

__device__ inline float SelectionKey(const float* scores, const float* bias, int e) {
  const float key = bias == nullptr ? scores[e] : scores[e] + bias[e];
  return isnan(key) ? -INFINITY : key;
}

// Groups whose keys survive the group limit, as a bit mask (all ones without a limit). Lane g
// scores group g (and g + 32) by its two best keys; the kept groups are picked in the total order.
__device__ uint64_t KeptGroups(const float* scores, const float* bias, int E,
                               kernels::GroupLimit limit) {
  if (limit.groups <= 1) return ~uint64_t{0};
  const int lane = threadIdx.x % kWarp;
  const int size = E / limit.groups;
  float group_score[2] = {-INFINITY, -INFINITY};
  for (int slot = 0; slot < 2; ++slot) {
    const int g = lane + slot * kWarp;
    if (g >= limit.groups) continue;
    float best = -INFINITY, second = -INFINITY;
    int best_at = -1;
    for (int e = 0; e < size; ++e) {  // The CPU's max_element: first maximum wins.
      const float key = SelectionKey(scores, bias, g * size + e);
      if (best_at < 0 || key > best) {
        best = key;
        best_at = e;
      }
    }
    for (int e = 0; e < size; ++e) {
      if (e != best_at) second = fmaxf(second, SelectionKey(scores, bias, g * size + e));
    }
    group_score[slot] = best + second;
  }
  uint64_t kept = 0;
  Candidate previous{INFINITY, -1};
  for (int pick = 0; pick < limit.kept_groups; ++pick) {
    Candidate mine = kNone;
    for (int slot = 0; slot < 2; ++slot) {
      const Candidate candidate{group_score[slot], lane + slot * kWarp};
      if (candidate.id < limit.groups && Better(previous, candidate) && Better(candidate, mine)) {
        mine = candidate;
      }
    }
    previous = WarpBest(mine);
    // Only NaN group scores (an infinite key plus its opposite) leave no candidate.
    if (previous.id >= limit.groups) break;
    kept |= uint64_t{1} << previous.id;
  }
  return kept;
}

// One warp per token: k rounds, each picking the best candidate after the previous pick in the
// total order, so no keys need storing and the order is the CPU's exactly.
__global__ void TopKKernel(const float* __restrict__ scores, const float* __restrict__ bias, int T,
                           int E, int k, int16_t* __restrict__ ids, kernels::GroupLimit limit) {
  const int t = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp;
  if (t >= T) return;
  const int lane = threadIdx.x % kWarp;
  const float* row = scores + int64_t{t} * E;
  const uint64_t kept = KeptGroups(row, bias, E, limit);
  const int group_size = limit.groups <= 1 ? E : E / limit.groups;
  Candidate previous{INFINITY, -1};
  for (int j = 0; j < k; ++j) {
    Candidate mine = kNone;
    for (int e = lane; e < E; e += kWarp) {
      const bool masked = ((kept >> (e / group_size)) & 1) == 0;
      const Candidate candidate{masked ? 0.0f : SelectionKey(row, bias, e), e};
      if (Better(previous, candidate) && Better(candidate, mine)) mine = candidate;
    }
    previous = WarpBest(mine);
    if (lane == 0) ids[int64_t{t} * k + j] = static_cast<int16_t>(previous.id);
  }
}

__device__ inline float SelectedSum(const float* scores, const int16_t* ids, int k) {
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) sum += scores[ids[j]];
  return sum;
}

// One thread per token (k is small); the same sequence of float operations as the CPU.
__global__ void GateWeightsKernel(const float* __restrict__ scores, const int16_t* __restrict__ ids,
                                  int T, int E, int k, bool normalize, float* __restrict__ gates) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= T) return;
  const float* row = scores + int64_t{t} * E;
  const int16_t* row_ids = ids + int64_t{t} * k;
  const float inv_z = normalize ? 1.0f / SelectedSum(row, row_ids, k) : 1.0f;
  for (int j = 0; j < k; ++j) gates[int64_t{t} * k + j] = row[row_ids[j]] * inv_z;
}

// One thread per token, the CPU's row functions transcribed (see kernels/cpu/router.cc for the
// derivations): selected-softmax shortcut, normalization backward, then the scoring function.
__global__ void GatesBackwardKernel(const float* __restrict__ logits,
                                    const float* __restrict__ scores,
                                    const int16_t* __restrict__ ids,
                                    const float* __restrict__ dgates, float* __restrict__ dlogits,
                                    int T, int E, int k, bool normalize, bool softmax) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= T) return;
  const float* row_scores = scores + int64_t{t} * E;
  const float* row_logits = logits + int64_t{t} * E;
  const int16_t* row_ids = ids + int64_t{t} * k;
  const float* row_dgates = dgates + int64_t{t} * k;
  float* row_dlogits = dlogits + int64_t{t} * E;
  float ds[kMaxK];
  const float inv_z = normalize ? 1.0f / SelectedSum(row_scores, row_ids, k) : 1.0f;
  float dot = 0.0f;
  for (int j = 0; j < k; ++j) dot += row_scores[row_ids[j]] * inv_z * row_dgates[j];
  if (normalize && softmax) {
    for (int j = 0; j < k; ++j) {
      row_dlogits[row_ids[j]] += row_scores[row_ids[j]] * inv_z * (row_dgates[j] - dot);
    }
    return;
  }
  for (int j = 0; j < k; ++j) ds[j] = normalize ? (row_dgates[j] - dot) * inv_z : row_dgates[j];
  if (!softmax) {
    for (int j = 0; j < k; ++j) {
      const int e = row_ids[j];
      row_dlogits[e] += ds[j] * row_scores[e] * Sigmoid(-row_logits[e]);
    }
    return;
  }
  float score_dot = 0.0f;
  for (int j = 0; j < k; ++j) score_dot += row_scores[row_ids[j]] * ds[j];
  for (int e = 0; e < E; ++e) row_dlogits[e] -= row_scores[e] * score_dot;
  for (int j = 0; j < k; ++j) row_dlogits[row_ids[j]] += row_scores[row_ids[j]] * ds[j];
}

absl::Status CheckK(int k, int E) {
  if (k < 1 || k > kMaxK || k > E) {
    return absl::InvalidArgumentError(
        absl::StrCat("top-k ", k, " out of range [1, min(", kMaxK, ", experts ", E, ")]"));
  }
  return absl::OkStatus();
}

absl::Status CheckGroupLimit(const kernels::GroupLimit& limit, int E) {
  if (limit.groups <= 1) return absl::OkStatus();
  if (limit.groups > kMaxGroups || E % limit.groups != 0 || E / limit.groups < 2 ||
      limit.kept_groups < 1 || limit.kept_groups > limit.groups) {
    return absl::InvalidArgumentError(
        absl::StrCat("group limit ", limit.kept_groups, " of ", limit.groups, " groups over ", E,
                     " experts: the CUDA router needs equal groups of >= 2 experts, at most ",
                     kMaxGroups, " groups and 1 <= kept groups <= groups"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RouterScores(const float* logits, float* scores, int T, int E,
                          kernels::ScoringFunction scoring, Stream stream) {
  if (T == 0) return absl::OkStatus();
  if (scoring == kernels::ScoringFunction::kSoftmax) {
    SoftmaxScoresKernel<<<WarpGrid(T), kThreadsPerBlock, 0, stream>>>(logits, scores, T, E);
  } else {
    const int64_t n = int64_t{T} * E;
    SigmoidScoresKernel<<<GridFor(n), kThreadsPerBlock, 0, stream>>>(logits, scores, n);
  }
  return LaunchStatus("RouterScores");
}

absl::Status TopK(const float* scores, const float* selection_bias, int T, int E, int k,
                  int16_t* ids, const kernels::GroupLimit& limit, Stream stream) {
  if (absl::Status status = CheckK(k, E); !status.ok()) return status;
  if (absl::Status status = CheckGroupLimit(limit, E); !status.ok()) return status;
  if (T == 0) return absl::OkStatus();
  TopKKernel<<<WarpGrid(T), kThreadsPerBlock, 0, stream>>>(scores, selection_bias, T, E, k, ids,
                                                           limit);
  return LaunchStatus("TopK");
}

absl::Status GateWeights(const float* scores, const int16_t* ids, int T, int E, int k,
                         bool normalize, float* gates, Stream stream) {
  if (T == 0) return absl::OkStatus();
  GateWeightsKernel<<<OneThreadEach(T), kThreadsPerBlock, 0, stream>>>(scores, ids, T, E, k,
                                                                       normalize, gates);
  return LaunchStatus("GateWeights");
}

absl::Status RouterGatesBackward(const float* logits, const float* scores, const int16_t* ids,
                                 const float* dgates, float* dlogits, int T, int E, int k,
                                 bool normalize, kernels::ScoringFunction scoring, Stream stream) {
  if (absl::Status status = CheckK(k, E); !status.ok()) return status;
  if (T == 0) return absl::OkStatus();
  GatesBackwardKernel<<<OneThreadEach(T), kThreadsPerBlock, 0, stream>>>(
      logits, scores, ids, dgates, dlogits, T, E, k, normalize,
      scoring == kernels::ScoringFunction::kSoftmax);
  return LaunchStatus("RouterGatesBackward");
}

}  // namespace tandem::cuda
