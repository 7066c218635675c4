#include "kernels/cpu/grouped_lora.h"

#include <cblas.h>

#include <cstdint>
#include <memory>

namespace tandem::cpu {
namespace {

// Row-major c[m, n] = alpha * op(a) . op(b) + beta * c.
void Sgemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const float* a,
           int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
              transpose_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c,
              ldc);
}

// Calls fn(first_row, rows, group) for each non-empty group. Groups are contiguous, so a weight
// shared by all of them sees the whole row range at once: one GEMM replaces a GEMM per group
// (small per-group GEMMs are the slow part), and a shared gradient sums over groups inside it.
template <typename Fn>
void ForEachSpan(const int* offsets, int groups, bool shared, Fn&& fn) {
  if (shared) {
    const int rows = offsets[groups] - offsets[0];
    if (rows > 0) fn(offsets[0], rows, 0);
    return;
  }
  for (int g = 0; g < groups; ++g) {
    const int rows = offsets[g + 1] - offsets[g];
    if (rows > 0) fn(offsets[g], rows, g);
  }
}

bool Degenerate(const int* offsets, int groups, int in, int out, int rank) {
  return groups <= 0 || in <= 0 || out <= 0 || rank <= 0 || offsets[groups] <= offsets[0];
}

}  // namespace

void GroupedLoraForward(const float* x, const int* offsets, int groups, int in, int out,
                        const kernels::GroupedLoraWeights& lora, float* h, float* y) {
  const int r = lora.rank;
  if (Degenerate(offsets, groups, in, out, r)) return;
  ForEachSpan(offsets, groups, lora.a_group_stride == 0, [&](int64_t first, int rows, int g) {
    Sgemm(false, true, rows, r, in, 1.0f, x + first * in, in, lora.a + g * lora.a_group_stride, in,
          0.0f, h + first * r, r);
  });
  ForEachSpan(offsets, groups, lora.b_group_stride == 0, [&](int64_t first, int rows, int g) {
    Sgemm(false, true, rows, out, r, lora.scale, h + first * r, r, lora.b + g * lora.b_group_stride,
          r, 1.0f, y + first * out, out);
  });
}

void GroupedLoraBackward(const float* x, const int* offsets, int groups, int in, int out,
                         const kernels::GroupedLoraWeights& lora, const float* h, const float* dy,
                         float* dx, float* da, float* db) {
  const int r = lora.rank;
  if (Degenerate(offsets, groups, in, out, r)) return;
  const bool shared_a = lora.a_group_stride == 0;
  const bool shared_b = lora.b_group_stride == 0;
  if (db != nullptr) {
    ForEachSpan(offsets, groups, shared_b, [&](int64_t first, int rows, int g) {
      Sgemm(true, false, out, r, rows, lora.scale, dy + first * out, out, h + first * r, r, 1.0f,
            db + g * lora.b_group_stride, r);
    });
  }
  if (dx == nullptr && da == nullptr) return;
  // dh is indexed from offsets[0], so it only spans the rows these groups own.
  const int64_t base = offsets[0];
  auto dh = std::make_unique_for_overwrite<float[]>((offsets[groups] - base) * r);
  ForEachSpan(offsets, groups, shared_b, [&](int64_t first, int rows, int g) {
    Sgemm(false, false, rows, r, out, lora.scale, dy + first * out, out,
          lora.b + g * lora.b_group_stride, r, 0.0f, dh.get() + (first - base) * r, r);
  });
  if (da != nullptr) {
    ForEachSpan(offsets, groups, shared_a, [&](int64_t first, int rows, int g) {
      Sgemm(true, false, r, in, rows, 1.0f, dh.get() + (first - base) * r, r, x + first * in, in,
            1.0f, da + g * lora.a_group_stride, in);
    });
  }
  if (dx != nullptr) {
    ForEachSpan(offsets, groups, shared_a, [&](int64_t first, int rows, int g) {
      Sgemm(false, false, rows, in, r, 1.0f, dh.get() + (first - base) * r, r,
            lora.a + g * lora.a_group_stride, in, 1.0f, dx + first * in, in);
    });
  }
}

}  // namespace tandem::cpu
