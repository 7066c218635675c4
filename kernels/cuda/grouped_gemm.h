#ifndef TANDEM_KERNELS_CUDA_GROUPED_GEMM_H_
#define TANDEM_KERNELS_CUDA_GROUPED_GEMM_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/device.h"

namespace tandem::cuda {

// Grouped GEMMs over the row groups of a permuted MoE batch: group g owns rows
// [offsets[g], offsets[g+1]) (offsets [groups+1] in device memory, as BuildPermutation leaves
// them), so the group sizes never travel to the host. Row-major, fp32 with fp32 accumulation.
// One tiled kernel of ours (64x64 tiles, 4x4 per thread) serves every expert layout through the
// per-group weight stride (0 = one weight shared by all groups).

// For each group: C_g = alpha · A_g · op(W_g) + beta · C_g, where A_g is rows of a [rows, k]
// (row stride lda) and C_g rows of c (row stride ldc, n columns used); W_g starts at
// w + g * w_group_stride and is [n, k] (row stride ldw) when transpose_w, i.e. op(W) = Wᵀ as in
// x · Wᵀ, else [k, n]. beta = 0 never reads C. max_rows >= offsets[groups] (the host
// knows such a bound, e.g. tokens · k) sizes the grid.
struct RowGroupedGemm {
  const float* a;
  int lda;
  const float* w;
  int64_t w_group_stride;
  int ldw;
  bool transpose_w;
  float* c;
  int ldc;
  int n;
  int k;
  float alpha = 1.0f;
  float beta = 0.0f;
};
// Groups of a few rows on average (at most kFewRowsPerGroup: decode, short prefills) with W as
// [n, k] and k of 128 or more go to GroupedGemmFewRows, the rest to tiles.
absl::Status GroupedGemm(const RowGroupedGemm& gemm, const int* offsets, int groups, int max_rows,
                         Stream stream = nullptr);

// The same product (transpose_w only, else INVALID_ARGUMENT) at the speed of reading W, for
// groups of a few rows: each column of C is one warp's pass over W's row, per 16 rows of the
// group. Any group sizes give the right result; a group of many rows rereads W (from cache).
inline constexpr int kFewRowsPerGroup = 32;
absl::Status GroupedGemmFewRows(const RowGroupedGemm& gemm, const int* offsets, int groups,
                                Stream stream = nullptr);

// The same product on the tensor cores: A_g and W_g are rounded to bf16 (nearest even, as
// common/dtype.h's ToBFloat16) as they are staged, products accumulate in fp32, and C stays
// fp32. 128x128 tiles of C, 32 deep. Exact wherever the inputs are bf16 values and the sums fit
// fp32's mantissa; otherwise within bf16's input rounding of GroupedGemm.
absl::Status GroupedGemmBf16(const RowGroupedGemm& gemm, const int* offsets, int groups,
                             int max_rows, Stream stream = nullptr);

// For each group: C_g += alpha · A_gᵀ · B_g, the weight gradient of a grouped projection: A_g
// and B_g are rows of a [rows, m] and b [rows, n]; C_g ([m, n], row stride ldc) starts at
// c + g * c_group_stride. With c_group_stride = 0 every group's rows add into the one C.
struct ReductionGroupedGemm {
  const float* a;
  int lda;
  const float* b;
  int ldb;
  float* c;
  int64_t c_group_stride;
  int ldc;
  int m;
  int n;
  float alpha = 1.0f;
};
absl::Status GroupedGemm(const ReductionGroupedGemm& gemm, const int* offsets, int groups,
                         Stream stream = nullptr);

}  // namespace tandem::cuda

#endif  // TANDEM_KERNELS_CUDA_GROUPED_GEMM_H_
