#include "kernels/cpu/reference_dense.h"

#include <cmath>
#include <cstdint>
#include <vector>

namespace tandem::cpu::reference {
namespace {

// Element (i, j) of op(X) for X stored row-major with row stride ld.
template <typename Real>
double At(const Real* x, int ld, bool transpose, int i, int j) {
  return transpose ? x[static_cast<int64_t>(j) * ld + i] : x[static_cast<int64_t>(i) * ld + j];
}

// Offset of element [t, h, d] in a [T, H, D] array.
int64_t Index(int t, int h, int d, int H, int D) {
  return (static_cast<int64_t>(t) * H + h) * D + d;
}

double InvFreq(int i, int head_dim, double theta) { return std::pow(theta, -2.0 * i / head_dim); }

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

double LogSumExp(const double* x, int n) {
  double max = x[0];
  for (int j = 1; j < n; ++j) max = x[j] > max ? x[j] : max;
  double sum = 0.0;
  for (int j = 0; j < n; ++j) sum += std::exp(x[j] - max);
  return max + std::log(sum);
}

template <typename Real>
std::vector<double> Row(const Real* x, int r, int n) {
  return std::vector<double>(x + static_cast<int64_t>(r) * n, x + static_cast<int64_t>(r + 1) * n);
}

}  // namespace

template <typename Real>
void Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, double alpha, const Real* a,
          int lda, const Real* b, int ldb, double beta, Real* c, int ldc) {
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int p = 0; p < k; ++p) {
        sum += At(a, lda, transpose_a, i, p) * At(b, ldb, transpose_b, p, j);
      }
      Real& cij = c[static_cast<int64_t>(i) * ldc + j];
      const double old = beta == 0.0 ? 0.0 : beta * cij;
      cij = static_cast<Real>(alpha * sum + old);
    }
  }
}

template <typename Real>
void Linear(const Real* x, const Real* w, Real* y, int rows, int in, int out, bool accumulate) {
  for (int r = 0; r < rows; ++r) {
    for (int o = 0; o < out; ++o) {
      double sum = accumulate ? y[static_cast<int64_t>(r) * out + o] : 0.0;
      for (int i = 0; i < in; ++i) {
        sum += double{x[static_cast<int64_t>(r) * in + i]} * w[static_cast<int64_t>(o) * in + i];
      }
      y[static_cast<int64_t>(r) * out + o] = static_cast<Real>(sum);
    }
  }
}

template <typename Real>
void LinearBackward(const Real* x, const Real* w, const Real* dy, Real* dx, Real* dw, int rows,
                    int in, int out) {
  for (int i = 0; i < in; ++i) {
    for (int r = 0; r < rows && dx != nullptr; ++r) {
      double sum = dx[static_cast<int64_t>(r) * in + i];
      for (int o = 0; o < out; ++o) {
        sum += double{dy[static_cast<int64_t>(r) * out + o]} * w[static_cast<int64_t>(o) * in + i];
      }
      dx[static_cast<int64_t>(r) * in + i] = static_cast<Real>(sum);
    }
    for (int o = 0; o < out && dw != nullptr; ++o) {
      double sum = dw[static_cast<int64_t>(o) * in + i];
      for (int r = 0; r < rows; ++r) {
        sum += double{dy[static_cast<int64_t>(r) * out + o]} * x[static_cast<int64_t>(r) * in + i];
      }
      dw[static_cast<int64_t>(o) * in + i] = static_cast<Real>(sum);
    }
  }
}

template <typename Real>
void RmsNorm(const Real* x, const Real* weight, Real* y, Real* rstd, int rows, int dim,
             double eps) {
  for (int r = 0; r < rows; ++r) {
    const std::vector<double> xr = Row(x, r, dim);
    double mean_sq = 0.0;
    for (double v : xr) mean_sq += v * v / dim;
    const double s = 1.0 / std::sqrt(mean_sq + eps);
    for (int i = 0; i < dim; ++i) {
      y[static_cast<int64_t>(r) * dim + i] = static_cast<Real>(xr[i] * s * weight[i]);
    }
    if (rstd != nullptr) rstd[r] = static_cast<Real>(s);
  }
}

// Through the full Jacobian ∂y_j/∂x_i = w_j s (δ_ij - x_i x_j s² / dim), s = rstd.
template <typename Real>
void RmsNormBackward(const Real* x, const Real* weight, const Real* rstd, const Real* dy, Real* dx,
                     Real* dweight, int rows, int dim) {
  for (int r = 0; r < rows; ++r) {
    const std::vector<double> xr = Row(x, r, dim);
    const std::vector<double> dyr = Row(dy, r, dim);
    const double s = rstd[r];
    for (int i = 0; i < dim; ++i) {
      if (dweight != nullptr) dweight[i] = static_cast<Real>(dweight[i] + dyr[i] * xr[i] * s);
      if (dx == nullptr) continue;
      double sum = 0.0;
      for (int j = 0; j < dim; ++j) {
        const double jac = weight[j] * s * ((i == j ? 1.0 : 0.0) - xr[i] * xr[j] * s * s / dim);
        sum += dyr[j] * jac;
      }
      Real& dxi = dx[static_cast<int64_t>(r) * dim + i];
      dxi = static_cast<Real>(dxi + sum);
    }
  }
}

// Applies [[c, -s], [s, c]] to every pair (i, i + half); RopeBackward applies its transpose.
template <typename Real>
void RotatePairs(Real* x, const int* positions, int tokens, int heads, int head_dim, double theta,
                 bool transpose) {
  const int half = head_dim / 2;
  for (int t = 0; t < tokens; ++t) {
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < half; ++i) {
        const double angle = positions[t] * InvFreq(i, head_dim, theta);
        const double c = std::cos(angle);
        const double s = transpose ? -std::sin(angle) : std::sin(angle);
        Real& a = x[Index(t, h, i, heads, head_dim)];
        Real& b = x[Index(t, h, i + half, heads, head_dim)];
        const double a0 = a, b0 = b;
        a = static_cast<Real>(c * a0 - s * b0);
        b = static_cast<Real>(s * a0 + c * b0);
      }
    }
  }
}

template <typename Real>
void Rope(Real* x, const int* positions, int tokens, int heads, int head_dim, double theta) {
  RotatePairs(x, positions, tokens, heads, head_dim, theta, false);
}

template <typename Real>
void RopeBackward(Real* dx, const int* positions, int tokens, int heads, int head_dim,
                  double theta) {
  RotatePairs(dx, positions, tokens, heads, head_dim, theta, true);
}

template <typename Real>
void CausalAttention(const Real* q, const Real* k, const Real* v, Real* out, Real* probs, int T,
                     int H, int KV, int D) {
  const int group = H / KV;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (int h = 0; h < H; ++h) {
    for (int t = 0; t < T; ++t) {
      std::vector<double> p(t + 1);
      for (int j = 0; j <= t; ++j) {
        double dot = 0.0;
        for (int d = 0; d < D; ++d)
          dot += double{q[Index(t, h, d, H, D)]} * k[Index(j, h / group, d, KV, D)];
        p[j] = scale * dot;
      }
      const double lse = LogSumExp(p.data(), t + 1);
      Real* prow = probs + (static_cast<int64_t>(h) * T + t) * T;
      for (int j = 0; j <= t; ++j) p[j] = std::exp(p[j] - lse);
      for (int j = 0; j < T; ++j) prow[j] = j <= t ? static_cast<Real>(p[j]) : Real{0};
      for (int d = 0; d < D; ++d) {
        double sum = 0.0;
        for (int j = 0; j <= t; ++j) sum += p[j] * v[Index(j, h / group, d, KV, D)];
        out[Index(t, h, d, H, D)] = static_cast<Real>(sum);
      }
    }
  }
}

// With S the scaled scores and P = softmax(S): dV = Pᵀ dO, dP = dO Vᵀ,
// dS = P ∘ (dP - rowsum(P ∘ dP)), dQ = scale dS K, dK = scale dSᵀ Q.
template <typename Real>
void CausalAttentionBackward(const Real* q, const Real* k, const Real* v, const Real* probs,
                             const Real* dout, Real* dq, Real* dk, Real* dv, int T, int H, int KV,
                             int D) {
  const int group = H / KV;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (int h = 0; h < H; ++h) {
    for (int t = 0; t < T; ++t) {
      const Real* prow = probs + (static_cast<int64_t>(h) * T + t) * T;
      std::vector<double> dp(t + 1);
      double dot = 0.0;
      for (int j = 0; j <= t; ++j) {
        for (int d = 0; d < D; ++d)
          dp[j] += double{dout[Index(t, h, d, H, D)]} * v[Index(j, h / group, d, KV, D)];
        dot += prow[j] * dp[j];
      }
      for (int j = 0; j <= t; ++j) {
        const double ds = prow[j] * (dp[j] - dot);
        for (int d = 0; d < D; ++d) {
          if (dv != nullptr) {
            Real& g = dv[Index(j, h / group, d, KV, D)];
            g = static_cast<Real>(g + double{prow[j]} * dout[Index(t, h, d, H, D)]);
          }
          if (dq != nullptr) {
            Real& g = dq[Index(t, h, d, H, D)];
            g = static_cast<Real>(g + scale * ds * k[Index(j, h / group, d, KV, D)]);
          }
          if (dk != nullptr) {
            Real& g = dk[Index(j, h / group, d, KV, D)];
            g = static_cast<Real>(g + scale * ds * q[Index(t, h, d, H, D)]);
          }
        }
      }
    }
  }
}

template <typename Real>
void DecodeAttention(const Real* q, const Real* k_cache, const Real* v_cache, int len, Real* out,
                     int H, int KV, int D, Real* scratch) {
  const int group = H / KV;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (int h = 0; h < H; ++h) {
    std::vector<double> p(len);
    for (int j = 0; j < len; ++j) {
      double dot = 0.0;
      for (int d = 0; d < D; ++d)
        dot += double{q[h * D + d]} * k_cache[Index(j, h / group, d, KV, D)];
      p[j] = scale * dot;
    }
    const double lse = LogSumExp(p.data(), len);
    for (int j = 0; j < len; ++j) {
      p[j] = std::exp(p[j] - lse);
      scratch[j] = static_cast<Real>(p[j]);
    }
    for (int d = 0; d < D; ++d) {
      double sum = 0.0;
      for (int j = 0; j < len; ++j) sum += p[j] * v_cache[Index(j, h / group, d, KV, D)];
      out[h * D + d] = static_cast<Real>(sum);
    }
  }
}

template <typename Real>
void SwiGlu(const Real* gate, const Real* up, Real* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = static_cast<Real>(gate[i] * Sigmoid(gate[i]) * up[i]);
  }
}

template <typename Real>
void SwiGluBackward(const Real* gate, const Real* up, const Real* dout, Real* dgate, Real* dup,
                    int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    const double s = Sigmoid(g);
    // d/dg [g σ(g)] = σ(g) + g σ(g) (1 - σ(g)).
    const double dsilu = s + g * s * (1.0 - s);
    if (dgate != nullptr) dgate[i] = static_cast<Real>(dgate[i] + dout[i] * up[i] * dsilu);
    if (dup != nullptr) dup[i] = static_cast<Real>(dup[i] + dout[i] * g * s);
  }
}

template <typename Real>
void LogSoftmax(const Real* logits, Real* logp, int rows, int vocab) {
  for (int r = 0; r < rows; ++r) {
    const std::vector<double> x = Row(logits, r, vocab);
    const double lse = LogSumExp(x.data(), vocab);
    for (int j = 0; j < vocab; ++j) {
      logp[static_cast<int64_t>(r) * vocab + j] = static_cast<Real>(x[j] - lse);
    }
  }
}

template <typename Real>
void TokenLogProbs(const Real* logits, const int* targets, Real* out, Real* lse, int rows,
                   int vocab) {
  for (int r = 0; r < rows; ++r) {
    const std::vector<double> x = Row(logits, r, vocab);
    const double row_lse = LogSumExp(x.data(), vocab);
    out[r] = static_cast<Real>(x[targets[r]] - row_lse);
    if (lse != nullptr) lse[r] = static_cast<Real>(row_lse);
  }
}

template <typename Real>
void TokenLogProbsBackward(const Real* logits, const int* targets, const Real* dlogprob,
                           Real* dlogits, int rows, int vocab) {
  for (int r = 0; r < rows; ++r) {
    const std::vector<double> x = Row(logits, r, vocab);
    const double row_lse = LogSumExp(x.data(), vocab);
    for (int j = 0; j < vocab; ++j) {
      const double indicator = j == targets[r] ? 1.0 : 0.0;
      Real& g = dlogits[static_cast<int64_t>(r) * vocab + j];
      g = static_cast<Real>(g + dlogprob[r] * (indicator - std::exp(x[j] - row_lse)));
    }
  }
}

#define TANDEM_INSTANTIATE_REFERENCE(Real)                                                        \
  template void Gemm(bool, bool, int, int, int, double, const Real*, int, const Real*, int,       \
                     double, Real*, int);                                                         \
  template void Linear(const Real*, const Real*, Real*, int, int, int, bool);                     \
  template void LinearBackward(const Real*, const Real*, const Real*, Real*, Real*, int, int,     \
                               int);                                                              \
  template void RmsNorm(const Real*, const Real*, Real*, Real*, int, int, double);                \
  template void RmsNormBackward(const Real*, const Real*, const Real*, const Real*, Real*, Real*, \
                                int, int);                                                        \
  template void Rope(Real*, const int*, int, int, int, double);                                   \
  template void RopeBackward(Real*, const int*, int, int, int, double);                           \
  template void CausalAttention(const Real*, const Real*, const Real*, Real*, Real*, int, int,    \
                                int, int);                                                        \
  template void CausalAttentionBackward(const Real*, const Real*, const Real*, const Real*,       \
                                        const Real*, Real*, Real*, Real*, int, int, int, int);    \
  template void DecodeAttention(const Real*, const Real*, const Real*, int, Real*, int, int, int, \
                                Real*);                                                           \
  template void SwiGlu(const Real*, const Real*, Real*, int64_t);                                 \
  template void SwiGluBackward(const Real*, const Real*, const Real*, Real*, Real*, int64_t);     \
  template void LogSoftmax(const Real*, Real*, int, int);                                         \
  template void TokenLogProbs(const Real*, const int*, Real*, Real*, int, int);                   \
  template void TokenLogProbsBackward(const Real*, const int*, const Real*, Real*, int, int);

TANDEM_INSTANTIATE_REFERENCE(float)
TANDEM_INSTANTIATE_REFERENCE(double)

#undef TANDEM_INSTANTIATE_REFERENCE

}  // namespace tandem::cpu::reference
