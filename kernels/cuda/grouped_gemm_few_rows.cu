// The row-grouped x · Wᵀ for groups of a few rows (decode: a handful of tokens per expert), where
// the product is bound by reading W: one warp per output column streams that column's row of W
// once, with every lane's loads in flight together, and dots it with the group's rows (cached).
#include <cstdint>

#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/launch.cuh"

namespace tandem::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
// Rows per pass over W's row: their sums live in registers; longer groups take more passes.
// Measured on the H200: 4 rows a pass read W at 68% of copy bandwidth at decode's expert shape
// (4 rows per group), 16 at 23% (predicated rows cost); but with 4 (and groups of at most 16
// rows sent here) a 32-sequence decode ran at 57% of this one's tokens/s, its one-group LoRA
// shrinks of 32 rows back on the tiles. Choosing the pass per launch is the next step.
constexpr int kRowsPerPass = 16;

__device__ inline float WarpSum(float value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

// sums[i] += A[first + i] · w over k, i < rows; lanes stride along k (by quads when kVector).
template <bool kVector>
__device__ inline void DotRows(const RowGroupedGemm& gemm, const float* __restrict__ w, int first,
                               int rows, int lane, float (&sums)[kRowsPerPass]) {
  if (kVector) {
#pragma unroll 4
    for (int kk = lane * 4; kk < gemm.k; kk += 32 * 4) {
      const float4 wq = __ldg(reinterpret_cast<const float4*>(w + kk));
#pragma unroll
      for (int i = 0; i < kRowsPerPass; ++i) {
        if (i < rows) {
          const float4 aq =
              __ldg(reinterpret_cast<const float4*>(gemm.a + int64_t{first + i} * gemm.lda + kk));
          sums[i] = fmaf(aq.x, wq.x, fmaf(aq.y, wq.y, fmaf(aq.z, wq.z, fmaf(aq.w, wq.w, sums[i]))));
        }
      }
    }
  } else {
#pragma unroll 4
    for (int kk = lane; kk < gemm.k; kk += 32) {
      const float wv = __ldg(w + kk);
#pragma unroll
      for (int i = 0; i < kRowsPerPass; ++i) {
        if (i < rows)
          sums[i] = fmaf(__ldg(gemm.a + int64_t{first + i} * gemm.lda + kk), wv, sums[i]);
      }
    }
  }
}

// Block (column block, group); warp w of it computes column blockIdx.x * kWarpsPerBlock + w.
template <bool kVector>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    FewRowsKernel(RowGroupedGemm gemm, const int* __restrict__ offsets) {
  const int group = blockIdx.y;
  const int first = offsets[group], last = offsets[group + 1];
  const int lane = threadIdx.x % 32;
  const int col = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (first >= last || col >= gemm.n) return;
  const float* w = gemm.w + group * gemm.w_group_stride + int64_t{col} * gemm.ldw;
  for (int r0 = first; r0 < last; r0 += kRowsPerPass) {
    const int rows = min(kRowsPerPass, last - r0);
    float sums[kRowsPerPass] = {};
    DotRows<kVector>(gemm, w, r0, rows, lane, sums);
#pragma unroll
    for (int i = 0; i < kRowsPerPass; ++i) {
      const float sum = WarpSum(sums[i]);  // Every lane holds it; lane i writes row i.
      if (lane == i && i < rows) {
        float* out = gemm.c + int64_t{r0 + i} * gemm.ldc + col;
        *out = gemm.alpha * sum + (gemm.beta == 0.0f ? 0.0f : gemm.beta * *out);
      }
    }
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

absl::Status GroupedGemmFewRows(const RowGroupedGemm& gemm, const int* offsets, int groups,
                                Stream stream) {
  if (!gemm.transpose_w) {
    return absl::InvalidArgumentError("the few-rows grouped GEMM reads W as [n, k] (transpose_w)");
  }
  if (groups <= 0 || gemm.n <= 0) return absl::OkStatus();
  if (groups > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("few-rows grouped GEMM over ", groups, " groups exceeds one launch"));
  }
  const dim3 grid((gemm.n + kWarpsPerBlock - 1) / kWarpsPerBlock, static_cast<unsigned>(groups));
  const bool vector = Aligned16(gemm.a) && gemm.lda % 4 == 0 && Aligned16(gemm.w) &&
                      gemm.ldw % 4 == 0 && gemm.w_group_stride % 4 == 0 && gemm.k % 4 == 0;
  if (vector) {
    FewRowsKernel<true><<<grid, kWarpsPerBlock * 32, 0, stream>>>(gemm, offsets);
  } else {
    FewRowsKernel<false><<<grid, kWarpsPerBlock * 32, 0, stream>>>(gemm, offsets);
  }
  return LaunchStatus("GroupedGemmFewRows");
}

}  // namespace tandem::cuda
