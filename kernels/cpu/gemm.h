#ifndef TANDEM_KERNELS_CPU_GEMM_H_
#define TANDEM_KERNELS_CPU_GEMM_H_

namespace tandem::cpu {

// C[m,n] = alpha * op(A)[m,k] · op(B)[k,n] + beta * C, row-major, lda/ldb/ldc are row strides.
// op(X) is X or Xᵀ; lda is the row stride of A as stored (so at least k, or m when transposed).
// As in BLAS, beta == 0 overwrites C without reading it (NaNs already in C do not survive).
void Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const float* a,
          int lda, const float* b, int ldb, float beta, float* c, int ldc);

// Sets OpenBLAS's thread count (openblas_set_num_threads); returns the previous count.
int SetBlasThreads(int threads);

// y[rows,out] = x[rows,in] · wᵀ with w [out,in] (a PyTorch Linear); accumulate=true adds into y.
void Linear(const float* x, const float* w, float* y, int rows, int in, int out,
            bool accumulate = false);

// dx[rows,in] += dy[rows,out] · w ; dw[out,in] += dyᵀ · x. Either output may be nullptr.
void LinearBackward(const float* x, const float* w, const float* dy, float* dx, float* dw, int rows,
                    int in, int out);

}  // namespace tandem::cpu

#endif  // TANDEM_KERNELS_CPU_GEMM_H_
