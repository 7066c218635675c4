// The row-grouped GEMM on the tensor cores (warp-level bf16 MMA through nvcuda::wmma).
#include <cuda_bf16.h>
#include <mma.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/row_tiles.cuh"

namespace tandem::cuda {
namespace {

using Bf16 = __nv_bfloat16;
namespace wmma = nvcuda::wmma;

// A block computes a kTile x kTile tile of C, kStep of k at a time. Its 8 warps stand 2 x 4, each
// owning a 64 x 32 patch: 4 x 2 fragments of 16 x 16.
constexpr int kTile = 128, kStep = 32, kThreads = 256, kFragment = 16;
// One block per multiprocessor (about 200 registers a thread): capped at 128 registers for two
// blocks, the kernel spilled and ran at 66 instead of 122 TFLOP/s on the H200.
constexpr int kWarpRows = 64, kWarpCols = 32;
constexpr int kRowFragments = kWarpRows / kFragment, kColFragments = kWarpCols / kFragment;
// Padding of 8 bf16 (16 bytes) per shared row spreads a fragment's rows over the banks and
// keeps every fragment 32-byte aligned, as wmma requires.
constexpr int kPad = 8;
constexpr int kLd = kStep + kPad;      // Rows of k: A always, W when it is [n, k].
constexpr int kLdWide = kTile + kPad;  // Rows of n: W when it is [k, n].
// Each thread stages 4 quads (4 consecutive floats along the contiguous axis) of A and of W.
constexpr int kQuads = kTile * kStep / 4 / kThreads;

struct Quads {
  float4 value[kQuads];
};

// Four floats at p[0..3] of which the first `valid` exist (aligned when kVector).
template <bool kVector>
__device__ inline float4 LoadQuad(const float* p, int valid) {
  if (kVector && valid >= 4) return *reinterpret_cast<const float4*>(p);
  float4 q = {0.0f, 0.0f, 0.0f, 0.0f};
  if (valid > 0) q.x = p[0];
  if (valid > 1) q.y = p[1];
  if (valid > 2) q.z = p[2];
  if (valid > 3) q.w = p[3];
  return q;
}

__device__ inline void StoreQuad(Bf16* to, float4 q) {
  reinterpret_cast<__nv_bfloat162*>(to)[0] = __floats2bfloat162_rn(q.x, q.y);
  reinterpret_cast<__nv_bfloat162*>(to)[1] = __floats2bfloat162_rn(q.z, q.w);
}

// Where the block's tiles of A and op(W) come from, and how they sit in shared memory:
// a[row][kk]; w[col][kk] when W is [n, k] (a column-major matrix_b), else w[kk][col].
template <bool kTransposeW, bool kVector>
struct Staging {
  const RowGroupedGemm& gemm;
  const float* w;  // This group's weight.
  int first_row, last_row, first_col;

  // Quad q of the slice at k0: A's (row, kk) from e = tid + q * kThreads, 8 quads per row.
  __device__ void Load(int k0, int tid, Quads& a, Quads& b) const {
#pragma unroll
    for (int q = 0; q < kQuads; ++q) {
      const int e = tid + q * kThreads;
      const int row = e / (kStep / 4), kk = e % (kStep / 4) * 4;
      const int r = first_row + row, kc = k0 + kk;
      a.value[q] =
          LoadQuad<kVector>(gemm.a + int64_t{r} * gemm.lda + kc, r < last_row ? gemm.k - kc : 0);
      if (kTransposeW) {
        const int c = first_col + row;
        b.value[q] =
            LoadQuad<kVector>(w + int64_t{c} * gemm.ldw + kc, c < gemm.n ? gemm.k - kc : 0);
      } else {
        const int wk = e / (kTile / 4), col = e % (kTile / 4) * 4;
        const int c = first_col + col, wkc = k0 + wk;
        b.value[q] =
            LoadQuad<kVector>(w + int64_t{wkc} * gemm.ldw + c, wkc < gemm.k ? gemm.n - c : 0);
      }
    }
  }

  __device__ static void Store(int tid, const Quads& a, const Quads& b, Bf16* a_tile,
                               Bf16* w_tile) {
#pragma unroll
    for (int q = 0; q < kQuads; ++q) {
      const int e = tid + q * kThreads;
      const int row = e / (kStep / 4), kk = e % (kStep / 4) * 4;
      StoreQuad(a_tile + row * kLd + kk, a.value[q]);
      if (kTransposeW) {
        StoreQuad(w_tile + row * kLd + kk, b.value[q]);
      } else {
        StoreQuad(w_tile + e / (kTile / 4) * kLdWide + e % (kTile / 4) * 4, b.value[q]);
      }
    }
  }
};

using Accumulators =
    wmma::fragment<wmma::accumulator, kFragment, kFragment, kFragment, float>[kRowFragments]
                                                                             [kColFragments];

template <bool kTransposeW>
__device__ void MultiplySlice(const Bf16* a_tile, const Bf16* w_tile, int warp_row, int warp_col,
                              Accumulators& acc) {
  using WLayout = std::conditional_t<kTransposeW, wmma::col_major, wmma::row_major>;
#pragma unroll
  for (int kk = 0; kk < kStep; kk += kFragment) {
    wmma::fragment<wmma::matrix_a, kFragment, kFragment, kFragment, Bf16, wmma::row_major>
        a[kRowFragments];
    wmma::fragment<wmma::matrix_b, kFragment, kFragment, kFragment, Bf16, WLayout> b[kColFragments];
#pragma unroll
    for (int i = 0; i < kRowFragments; ++i) {
      wmma::load_matrix_sync(a[i], a_tile + (warp_row * kWarpRows + i * kFragment) * kLd + kk, kLd);
    }
#pragma unroll
    for (int j = 0; j < kColFragments; ++j) {
      const int col = warp_col * kWarpCols + j * kFragment;
      if (kTransposeW) {
        wmma::load_matrix_sync(b[j], w_tile + col * kLd + kk, kLd);
      } else {
        wmma::load_matrix_sync(b[j], w_tile + kk * kLdWide + col, kLdWide);
      }
    }
#pragma unroll
    for (int i = 0; i < kRowFragments; ++i) {
#pragma unroll
      for (int j = 0; j < kColFragments; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
    }
  }
}

// Each fragment goes through the warp's 16 x 16 staging square to C: alpha, beta, bounds.
__device__ void StoreAccumulators(const RowGroupedGemm& gemm, Accumulators& acc, float* stage,
                                  int first_row, int last_row, int first_col, int lane) {
#pragma unroll
  for (int i = 0; i < kRowFragments; ++i) {
#pragma unroll
    for (int j = 0; j < kColFragments; ++j) {
      wmma::store_matrix_sync(stage, acc[i][j], kFragment, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < kFragment * kFragment; e += 32) {
        const int r = first_row + i * kFragment + e / kFragment;
        const int c = first_col + j * kFragment + e % kFragment;
        if (r < last_row && c < gemm.n) {
          float* out = gemm.c + int64_t{r} * gemm.ldc + c;
          *out = gemm.alpha * stage[e] + (gemm.beta == 0.0f ? 0.0f : gemm.beta * *out);
        }
      }
      __syncwarp();
    }
  }
}

template <bool kTransposeW, bool kVector>
__global__ void __launch_bounds__(kThreads)
    RowGroupedBf16Kernel(RowGroupedGemm gemm, const int* __restrict__ offsets, int groups) {
  int group, first_row, last_row;
  if (!FindRowTile<kTile>(offsets, groups, blockIdx.y, group, first_row, last_row)) return;
  __shared__ __align__(32) Bf16 a_tile[kTile * kLd];
  __shared__ __align__(32) Bf16 w_tile[kTile * kLd];  // >= kStep * kLdWide.
  __shared__ __align__(32) float stage[kThreads / 32][kFragment * kFragment];
  static_assert(kTile * kLd >= kStep * kLdWide);
  const int tid = threadIdx.x, warp = tid / 32;
  const int warp_row = warp / (kTile / kWarpCols), warp_col = warp % (kTile / kWarpCols);
  const int first_col = blockIdx.x * kTile;
  const Staging<kTransposeW, kVector> staging{gemm, gemm.w + group * gemm.w_group_stride, first_row,
                                              last_row, first_col};
  Accumulators acc;
#pragma unroll
  for (int i = 0; i < kRowFragments; ++i) {
#pragma unroll
    for (int j = 0; j < kColFragments; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
  }
  // The next slice is read from global memory into registers while this one multiplies.
  Quads a, b;
  staging.Load(0, tid, a, b);
  staging.Store(tid, a, b, a_tile, w_tile);
  __syncthreads();
  for (int k0 = 0; k0 < gemm.k; k0 += kStep) {
    const bool more = k0 + kStep < gemm.k;
    if (more) staging.Load(k0 + kStep, tid, a, b);
    MultiplySlice<kTransposeW>(a_tile, w_tile, warp_row, warp_col, acc);
    __syncthreads();
    if (more) {
      staging.Store(tid, a, b, a_tile, w_tile);
      __syncthreads();
    }
  }
  StoreAccumulators(gemm, acc, stage[warp], first_row + warp_row * kWarpRows, last_row,
                    first_col + warp_col * kWarpCols, tid % 32);
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Quads of A and W load as float4 when every row of both starts 16-byte aligned.
bool VectorLoads(const RowGroupedGemm& gemm) {
  return Aligned16(gemm.a) && gemm.lda % 4 == 0 && Aligned16(gemm.w) && gemm.ldw % 4 == 0 &&
         gemm.w_group_stride % 4 == 0;
}

template <bool kTransposeW>
void Launch(const RowGroupedGemm& gemm, const int* offsets, int groups, dim3 grid, Stream stream) {
  if (VectorLoads(gemm)) {
    RowGroupedBf16Kernel<kTransposeW, true><<<grid, kThreads, 0, stream>>>(gemm, offsets, groups);
  } else {
    RowGroupedBf16Kernel<kTransposeW, false><<<grid, kThreads, 0, stream>>>(gemm, offsets, groups);
  }
}

}  // namespace

absl::Status GroupedGemmBf16(const RowGroupedGemm& gemm, const int* offsets, int groups,
                             int max_rows, Stream stream) {
  if (groups <= 0 || gemm.n <= 0 || max_rows <= 0) return absl::OkStatus();
  const int64_t row_tiles = RowTileBound<kTile>(max_rows, groups);
  if (row_tiles > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("bf16 grouped GEMM over ", max_rows, " rows in ",
                                                   groups, " groups exceeds one launch"));
  }
  const dim3 grid(static_cast<unsigned>((gemm.n + kTile - 1) / kTile),
                  static_cast<unsigned>(row_tiles));
  if (gemm.transpose_w) {
    Launch<true>(gemm, offsets, groups, grid, stream);
  } else {
    Launch<false>(gemm, offsets, groups, grid, stream);
  }
  return LaunchStatus("GroupedGemmBf16");
}

}  // namespace tandem::cuda
