#include "kernels/cpu/gemm.h"

#include <cblas.h>

#include <cstdint>

namespace tandem::cpu {
namespace {

// BLAS rejects k == 0 (it checks lda >= max(1, k) and friends) although the product is simply
// empty, so the beta scaling is done here.
void ScaleRows(int m, int n, float beta, float* c, int ldc) {
  for (int i = 0; i < m; ++i) {
    float* row = c + static_cast<int64_t>(i) * ldc;
    for (int j = 0; j < n; ++j) row[j] = beta == 0.0f ? 0.0f : beta * row[j];
  }
}

}  // namespace

void Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const float* a,
          int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    ScaleRows(m, n, beta, c, ldc);
    return;
  }
  cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
              transpose_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c,
              ldc);
}

int SetBlasThreads(int threads) {
  const int previous = openblas_get_num_threads();
  openblas_set_num_threads(threads);
  return previous;
}

void Linear(const float* x, const float* w, float* y, int rows, int in, int out, bool accumulate) {
  Gemm(false, true, rows, out, in, 1.0f, x, in, w, in, accumulate ? 1.0f : 0.0f, y, out);
}

void LinearBackward(const float* x, const float* w, const float* dy, float* dx, float* dw, int rows,
                    int in, int out) {
  if (dx != nullptr) Gemm(false, false, rows, in, out, 1.0f, dy, out, w, in, 1.0f, dx, in);
  if (dw != nullptr) Gemm(true, false, out, in, rows, 1.0f, dy, out, x, in, 1.0f, dw, in);
}

}  // namespace tandem::cpu
