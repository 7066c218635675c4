#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/permute.h"

namespace tandem::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = kThreadsPerBlock / kWarp;

// One warp per expert counts its slots 32 at a time with a ballot: deterministic, no atomics.
__global__ void CountKernel(const int16_t* __restrict__ ids, int slots, int E,
                            int* __restrict__ offsets) {
  const int e = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp;
  if (e >= E) return;
  const int lane = threadIdx.x % kWarp;
  int count = 0;
  for (int base = 0; base < slots; base += kWarp) {
    const int s = base + lane;
    count += __popc(__ballot_sync(0xffffffff, s < slots && ids[s] == e));
  }
  if (lane == 0) offsets[e + 1] = count;
}

// offsets[0] = 0 and an inclusive scan of the counts; E is at most 32767, so one thread is
// enough next to the per-expert passes around it.
__global__ void ScanKernel(int* offsets, int E) {
  offsets[0] = 0;
  for (int e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
}

// One warp per expert places its slots in ascending slot order: the ballot's prefix count is the
// slot's rank among this expert's slots in the same 32, so the order is stable.
__global__ void PlaceKernel(const int16_t* __restrict__ ids, int slots, int E,
                            const int* __restrict__ offsets, int* __restrict__ source,
                            int* __restrict__ position) {
  const int e = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp;
  if (e >= E) return;
  const int lane = threadIdx.x % kWarp;
  const unsigned earlier_lanes = (1u << lane) - 1;
  int cursor = offsets[e];
  for (int base = 0; base < slots; base += kWarp) {
    const int s = base + lane;
    const bool mine = s < slots && ids[s] == e;
    const unsigned matches = __ballot_sync(0xffffffff, mine);
    if (mine) {
      const int p = cursor + __popc(matches & earlier_lanes);
      source[p] = s;
      position[s] = p;
    }
    cursor += __popc(matches);
  }
}

// Slots whose id is out of range keep position -1 (set before placement).
__global__ void InvalidatePositionsKernel(int* position, int slots) {
  for (int s = blockIdx.x * blockDim.x + threadIdx.x; s < slots; s += gridDim.x * blockDim.x) {
    position[s] = -1;
  }
}

// Block per permuted row; rows past offsets[E] (only with invalid ids) are left alone.
__global__ void PermuteRowsKernel(const float* __restrict__ x, const int* __restrict__ offsets,
                                  const int* __restrict__ source, int E, int k,
                                  float* __restrict__ out, int d) {
  const int p = blockIdx.x;
  if (p >= offsets[E]) return;
  const float* from = x + int64_t{source[p] / k} * d;
  float* to = out + int64_t{p} * d;
  for (int c = threadIdx.x; c < d; c += blockDim.x) to[c] = from[c];
}

// Block per token: adds its k permuted rows, scaled by their gates (1 without gates).
__global__ void GatherAddKernel(const float* __restrict__ rows, const int* __restrict__ position,
                                const float* __restrict__ gates, int k, float* __restrict__ out,
                                int d) {
  const int t = blockIdx.x;
  float* target = out + int64_t{t} * d;
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float sum = target[c];
    for (int j = 0; j < k; ++j) {
      const int s = t * k + j;
      const int p = position[s];
      if (p < 0) continue;
      sum += (gates == nullptr ? 1.0f : gates[s]) * rows[int64_t{p} * d + c];
    }
    target[c] = sum;
  }
}

// Block per permuted row p of slot s = source[p], token t = s / k:
// dy[p] += gates[s] dout[t];  dgates[s] += y[p] · dout[t].
__global__ void UnpermuteBackwardKernel(const float* __restrict__ y,
                                        const int* __restrict__ offsets,
                                        const int* __restrict__ source, int E, int k,
                                        const float* __restrict__ gates,
                                        const float* __restrict__ dout, float* __restrict__ dy,
                                        float* __restrict__ dgates, int d) {
  __shared__ float scratch[32];
  const int p = blockIdx.x;
  if (p >= offsets[E]) return;  // Uniform across the block: no barrier is skipped by some.
  const int s = source[p];
  const float* dout_row = dout + int64_t{s / k} * d;
  const float* y_row = y + int64_t{p} * d;
  float dot = 0.0f;
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    if (dy != nullptr) dy[int64_t{p} * d + c] += gates[s] * dout_row[c];
    dot += y_row[c] * dout_row[c];
  }
  if (dgates == nullptr) return;
  dot = BlockSum(dot, scratch);
  if (threadIdx.x == 0) dgates[s] += dot;
}

}  // namespace

absl::StatusOr<DevicePermutation> DevicePermutation::Allocate(int tokens, int k, int experts) {
  const size_t slots = static_cast<size_t>(tokens) * k;
  absl::StatusOr<DeviceArray<int>> offsets = DeviceArray<int>::Zeros(experts + 1);
  if (!offsets.ok()) return offsets.status();
  absl::StatusOr<DeviceArray<int>> source = DeviceArray<int>::Zeros(slots);
  if (!source.ok()) return source.status();
  absl::StatusOr<DeviceArray<int>> position = DeviceArray<int>::Zeros(slots);
  if (!position.ok()) return position.status();
  return DevicePermutation{.offsets = *std::move(offsets),
                           .source = *std::move(source),
                           .position = *std::move(position),
                           .tokens = 0,
                           .capacity = tokens,
                           .k = k,
                           .experts = experts};
}

absl::Status BuildPermutation(const int16_t* ids, int T, int k, int E,
                              DevicePermutation& permutation, Stream stream) {
  const int64_t slots = int64_t{T} * k;
  if (T > permutation.capacity || k != permutation.k || E != permutation.experts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "permutation allocated for ", permutation.capacity, " tokens, k ", permutation.k, ", ",
        permutation.experts, " experts cannot hold ", T, " tokens, k ", k, ", ", E, " experts"));
  }
  permutation.tokens = T;
  const unsigned expert_blocks = static_cast<unsigned>((E + kWarpsPerBlock - 1) / kWarpsPerBlock);
  InvalidatePositionsKernel<<<GridFor(slots), kThreadsPerBlock, 0, stream>>>(
      permutation.position.data(), static_cast<int>(slots));
  CountKernel<<<expert_blocks, kThreadsPerBlock, 0, stream>>>(ids, static_cast<int>(slots), E,
                                                              permutation.offsets.data());
  ScanKernel<<<1, 1, 0, stream>>>(permutation.offsets.data(), E);
  PlaceKernel<<<expert_blocks, kThreadsPerBlock, 0, stream>>>(
      ids, static_cast<int>(slots), E, permutation.offsets.data(), permutation.source.data(),
      permutation.position.data());
  return LaunchStatus("BuildPermutation");
}

absl::Status PermuteRows(const float* x, const DevicePermutation& permutation, float* out, int d,
                         Stream stream) {
  const int rows = permutation.tokens * permutation.k;
  if (rows == 0) return absl::OkStatus();
  PermuteRowsKernel<<<rows, kThreadsPerBlock, 0, stream>>>(
      x, permutation.offsets.data(), permutation.source.data(), permutation.experts, permutation.k,
      out, d);
  return LaunchStatus("PermuteRows");
}

absl::Status PermuteRowsBackward(const float* dout, const DevicePermutation& permutation, float* dx,
                                 int d, Stream stream) {
  if (permutation.tokens == 0) return absl::OkStatus();
  GatherAddKernel<<<permutation.tokens, kThreadsPerBlock, 0, stream>>>(
      dout, permutation.position.data(), nullptr, permutation.k, dx, d);
  return LaunchStatus("PermuteRowsBackward");
}

absl::Status UnpermuteAdd(const float* y, const DevicePermutation& permutation, const float* gates,
                          float* out, int d, Stream stream) {
  if (permutation.tokens == 0) return absl::OkStatus();
  GatherAddKernel<<<permutation.tokens, kThreadsPerBlock, 0, stream>>>(
      y, permutation.position.data(), gates, permutation.k, out, d);
  return LaunchStatus("UnpermuteAdd");
}

absl::Status UnpermuteAddBackward(const float* y, const DevicePermutation& permutation,
                                  const float* gates, const float* dout, float* dy, float* dgates,
                                  int d, Stream stream) {
  const int rows = permutation.tokens * permutation.k;
  if (rows == 0 || (dy == nullptr && dgates == nullptr)) return absl::OkStatus();
  UnpermuteBackwardKernel<<<rows, kThreadsPerBlock, 0, stream>>>(
      y, permutation.offsets.data(), permutation.source.data(), permutation.experts, permutation.k,
      gates, dout, dy, dgates, d);
  return LaunchStatus("UnpermuteAddBackward");
}

}  // namespace tandem::cuda
