#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/row_tiles.cuh"

namespace tandem::cuda {
namespace {

// A block computes a kTile x kTile tile of C in kStep-deep slices; its 256 threads (16 x 16)
// each own a kMicro x kMicro patch, and each slice's tiles are 1024 floats: 4 per thread.
template <int kTileSize, int kStepSize, int kMicroSize>
struct Tiling {
  static constexpr int kTile = kTileSize;
  static constexpr int kStep = kStepSize;
  static constexpr int kMicro = kMicroSize;
  static constexpr int kSide = kTile / kMicro;  // Threads along each side.
  static_assert(kSide * kSide == 256 && kTile * kStep == 1024);
};
// Small groups, narrow outputs (LoRA's rank-wide halves, routers).
using SmallTiles = Tiling<64, 16, 4>;
// Wide outputs over many rows: an 8x8 patch does twice the arithmetic per shared-memory read.
using LargeTiles = Tiling<128, 8, 8>;
constexpr int kGemmThreads = 256;

// The patch product of one slice: acc += a_tile[kk][rows] ⊗ b_tile[kk][cols].
template <typename T>
__device__ inline void MultiplySlice(const float (&a_tile)[T::kStep][T::kTile],
                                     const float (&b_tile)[T::kStep][T::kTile], int ty, int tx,
                                     float (&acc)[T::kMicro][T::kMicro]) {
#pragma unroll
  for (int kk = 0; kk < T::kStep; ++kk) {
    float a[T::kMicro], b[T::kMicro];
#pragma unroll
    for (int i = 0; i < T::kMicro; ++i) a[i] = a_tile[kk][ty * T::kMicro + i];
#pragma unroll
    for (int j = 0; j < T::kMicro; ++j) b[j] = b_tile[kk][tx * T::kMicro + j];
#pragma unroll
    for (int i = 0; i < T::kMicro; ++i) {
#pragma unroll
      for (int j = 0; j < T::kMicro; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
  }
}

template <typename T, bool kTransposeW>
__global__ void __launch_bounds__(kGemmThreads)
    RowGroupedKernel(RowGroupedGemm gemm, const int* __restrict__ offsets, int groups) {
  constexpr int kTile = T::kTile, kStep = T::kStep, kMicro = T::kMicro;
  int group, first_row, last_row;
  if (!FindRowTile<kTile>(offsets, groups, blockIdx.y, group, first_row, last_row)) return;
  __shared__ float a_tile[kStep][kTile];  // Transposed: a_tile[kk][row].
  __shared__ float b_tile[kStep][kTile];  // b_tile[kk][col] = op(W)[k0 + kk][col].
  const int tid = threadIdx.x, ty = tid / T::kSide, tx = tid % T::kSide;
  const int first_col = blockIdx.x * kTile;
  const float* w = gemm.w + group * gemm.w_group_stride;
  float acc[kMicro][kMicro] = {};
  for (int k0 = 0; k0 < gemm.k; k0 += kStep) {
    for (int e = tid; e < kTile * kStep; e += kGemmThreads) {
      // A: consecutive threads walk k within a row (contiguous in memory).
      const int row = e / kStep, kk = e % kStep;
      const int r = first_row + row, kc = k0 + kk;
      a_tile[kk][row] = r < last_row && kc < gemm.k ? gemm.a[int64_t{r} * gemm.lda + kc] : 0.0f;
      // op(W): contiguous along k when W is [n, k], along n when it is [k, n].
      const int col = kTransposeW ? e / kStep : e % kTile;
      const int wk = kTransposeW ? e % kStep : e / kTile;
      const int c = first_col + col, wkc = k0 + wk;
      float value = 0.0f;
      if (c < gemm.n && wkc < gemm.k) {
        value = kTransposeW ? w[int64_t{c} * gemm.ldw + wkc] : w[int64_t{wkc} * gemm.ldw + c];
      }
      b_tile[wk][col] = value;
    }
    __syncthreads();
    MultiplySlice<T>(a_tile, b_tile, ty, tx, acc);
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < kMicro; ++i) {
    const int r = first_row + ty * kMicro + i;
    if (r >= last_row) continue;
#pragma unroll
    for (int j = 0; j < kMicro; ++j) {
      const int c = first_col + tx * kMicro + j;
      if (c >= gemm.n) continue;
      float* out = gemm.c + int64_t{r} * gemm.ldc + c;
      *out = gemm.alpha * acc[i][j] + (gemm.beta == 0.0f ? 0.0f : gemm.beta * *out);
    }
  }
}

// One launch of the row-grouped kernel with tiling T.
template <typename T>
absl::Status LaunchRowGrouped(const RowGroupedGemm& gemm, const int* offsets, int groups,
                              int max_rows, Stream stream) {
  const int64_t row_tiles = RowTileBound<T::kTile>(max_rows, groups);
  if (row_tiles > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("grouped GEMM over ", max_rows, " rows in ",
                                                   groups, " groups exceeds one launch"));
  }
  const dim3 grid(static_cast<unsigned>((gemm.n + T::kTile - 1) / T::kTile),
                  static_cast<unsigned>(row_tiles));
  if (gemm.transpose_w) {
    RowGroupedKernel<T, true><<<grid, kGemmThreads, 0, stream>>>(gemm, offsets, groups);
  } else {
    RowGroupedKernel<T, false><<<grid, kGemmThreads, 0, stream>>>(gemm, offsets, groups);
  }
  return LaunchStatus("GroupedGemm (row groups)");
}

// Block (col tile, row tile of C_g, group): reduces over the group's rows, kStep at a time.
// With a shared C, blockIdx.z = 0 covers every group's rows at once, so no two blocks add into
// the same element.
__global__ void __launch_bounds__(kGemmThreads)
    ReductionGroupedKernel(ReductionGroupedGemm gemm, const int* __restrict__ offsets, int groups) {
  using T = SmallTiles;
  constexpr int kTile = T::kTile, kStep = T::kStep, kMicro = T::kMicro;
  const bool shared = gemm.c_group_stride == 0;
  const int group = blockIdx.z;
  const int first = offsets[shared ? 0 : group];
  const int last = offsets[shared ? groups : group + 1];
  if (first >= last) return;  // An empty group adds nothing (uniform: no barrier is skipped).
  __shared__ float a_tile[kStep][kTile];  // a_tile[kk][i] = A[first + r0 + kk][i0 + i]
  __shared__ float b_tile[kStep][kTile];
  const int tid = threadIdx.x, ty = tid / T::kSide, tx = tid % T::kSide;
  const int first_i = blockIdx.y * kTile, first_j = blockIdx.x * kTile;
  float acc[kMicro][kMicro] = {};
  for (int r0 = first; r0 < last; r0 += kStep) {
    for (int e = tid; e < kTile * kStep; e += kGemmThreads) {
      const int kk = e / kTile, col = e % kTile;  // Contiguous along m and n.
      const int r = r0 + kk;
      a_tile[kk][col] =
          r < last && first_i + col < gemm.m ? gemm.a[int64_t{r} * gemm.lda + first_i + col] : 0.0f;
      b_tile[kk][col] =
          r < last && first_j + col < gemm.n ? gemm.b[int64_t{r} * gemm.ldb + first_j + col] : 0.0f;
    }
    __syncthreads();
    MultiplySlice<T>(a_tile, b_tile, ty, tx, acc);
    __syncthreads();
  }
  float* c = gemm.c + group * gemm.c_group_stride;
#pragma unroll
  for (int i = 0; i < kMicro; ++i) {
    const int ci = first_i + ty * kMicro + i;
    if (ci >= gemm.m) continue;
#pragma unroll
    for (int j = 0; j < kMicro; ++j) {
      const int cj = first_j + tx * kMicro + j;
      if (cj < gemm.n) c[int64_t{ci} * gemm.ldc + cj] += gemm.alpha * acc[i][j];
    }
  }
}

unsigned Tiles(int64_t n) {
  return static_cast<unsigned>((n + SmallTiles::kTile - 1) / SmallTiles::kTile);
}

}  // namespace

absl::Status GroupedGemm(const RowGroupedGemm& gemm, const int* offsets, int groups, int max_rows,
                         Stream stream) {
  if (groups <= 0 || gemm.n <= 0 || max_rows <= 0) return absl::OkStatus();
  // Few rows against a long W row: reading W is the work, and a tile's k loop would serialize it.
  constexpr int kLongRow = 128;
  if (gemm.transpose_w && gemm.k >= kLongRow && max_rows <= kFewRowsPerGroup * groups) {
    return GroupedGemmFewRows(gemm, offsets, groups, stream);
  }
  // Large tiles pay off once most of a tile is real work: wide outputs, full row tiles.
  const bool large = gemm.n >= LargeTiles::kTile && max_rows / groups >= LargeTiles::kTile;
  return large ? LaunchRowGrouped<LargeTiles>(gemm, offsets, groups, max_rows, stream)
               : LaunchRowGrouped<SmallTiles>(gemm, offsets, groups, max_rows, stream);
}

absl::Status GroupedGemm(const ReductionGroupedGemm& gemm, const int* offsets, int groups,
                         Stream stream) {
  if (groups <= 0 || gemm.m <= 0 || gemm.n <= 0) return absl::OkStatus();
  if (Tiles(gemm.m) > 65535 || (gemm.c_group_stride != 0 && groups > 65535)) {
    return absl::InvalidArgumentError(absl::StrCat("grouped weight gradient with ", gemm.m,
                                                   " rows in ", groups,
                                                   " groups exceeds one launch"));
  }
  const unsigned z = gemm.c_group_stride == 0 ? 1 : static_cast<unsigned>(groups);
  ReductionGroupedKernel<<<dim3(Tiles(gemm.n), Tiles(gemm.m), z), kGemmThreads, 0, stream>>>(
      gemm, offsets, groups);
  return LaunchStatus("GroupedGemm (weight gradient)");
}

}  // namespace tandem::cuda
