#ifndef TANDEM_KERNELS_CPU_REFERENCE_DENSE_H_
#define TANDEM_KERNELS_CPU_REFERENCE_DENSE_H_

#include <cstdint>

// Plain, obviously-correct twins of the dense kernels, for tests only: naive loops, double
// accumulation, no BLAS. They take the same arguments as the fast kernels, with Real = float to
// compare against them and Real = double for finite-difference gradient checks (scalar parameters
// are double so that both element types deduce cleanly). Instantiated for float and double.
namespace tandem::cpu::reference {

template <typename Real>
void Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, double alpha, const Real* a,
          int lda, const Real* b, int ldb, double beta, Real* c, int ldc);

template <typename Real>
void Linear(const Real* x, const Real* w, Real* y, int rows, int in, int out,
            bool accumulate = false);

template <typename Real>
void LinearBackward(const Real* x, const Real* w, const Real* dy, Real* dx, Real* dw, int rows,
                    int in, int out);

template <typename Real>
void RmsNorm(const Real* x, const Real* weight, Real* y, Real* rstd, int rows, int dim, double eps);

template <typename Real>
void RmsNormBackward(const Real* x, const Real* weight, const Real* rstd, const Real* dy, Real* dx,
                     Real* dweight, int rows, int dim);

template <typename Real>
void Rope(Real* x, const int* positions, int tokens, int heads, int head_dim, double theta);

template <typename Real>
void RopeBackward(Real* dx, const int* positions, int tokens, int heads, int head_dim,
                  double theta);

template <typename Real>
void CausalAttention(const Real* q, const Real* k, const Real* v, Real* out, Real* probs, int T,
                     int H, int KV, int D);

template <typename Real>
void CausalAttentionBackward(const Real* q, const Real* k, const Real* v, const Real* probs,
                             const Real* dout, Real* dq, Real* dk, Real* dv, int T, int H, int KV,
                             int D);

template <typename Real>
void DecodeAttention(const Real* q, const Real* k_cache, const Real* v_cache, int len, Real* out,
                     int H, int KV, int D, Real* scratch);

template <typename Real>
void SwiGlu(const Real* gate, const Real* up, Real* out, int64_t n);

template <typename Real>
void SwiGluBackward(const Real* gate, const Real* up, const Real* dout, Real* dgate, Real* dup,
                    int64_t n);

template <typename Real>
void LogSoftmax(const Real* logits, Real* logp, int rows, int vocab);

template <typename Real>
void TokenLogProbs(const Real* logits, const int* targets, Real* out, Real* lse, int rows,
                   int vocab);

template <typename Real>
void TokenLogProbsBackward(const Real* logits, const int* targets, const Real* dlogprob,
                           Real* dlogits, int rows, int vocab);

}  // namespace tandem::cpu::reference

#endif  // TANDEM_KERNELS_CPU_REFERENCE_DENSE_H_
