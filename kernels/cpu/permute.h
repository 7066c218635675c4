#ifndef TANDEM_KERNELS_CPU_PERMUTE_H_
#define TANDEM_KERNELS_CPU_PERMUTE_H_

#include <cstdint>
#include <vector>

// Token dispatch by expert: routed rows are gathered so that each expert's rows are contiguous
// (the input of a grouped GEMM), then scattered back and combined with the gate weights.

namespace tandem::cpu {

struct ExpertPermutation {
  std::vector<int>
      offsets;  // [E+1]: rows of expert e are [offsets[e], offsets[e+1]) in permuted order.
  std::vector<int> source;  // [T*k]: permuted row p comes from routing slot source[p] = t*k + j.
  // Slots per token, set by BuildPermutation: the row kernels need it to find the token of a slot,
  // and neither vector's size determines it.
  int k = 0;
};

// Stable: within an expert, slots keep ascending (t, j) order. ids must be in [0, E) (run
// ValidateRoutes on replayed routes first); an id outside aborts rather than corrupting memory.
ExpertPermutation BuildPermutation(const int16_t* ids, int T, int k, int E);

// out[p, :] = x[source[p] / k, :]   (x [T, d], out [T*k, d])
void PermuteRows(const float* x, const ExpertPermutation& permutation, float* out, int d);

// dx[t, :] += dout[p, :] for every p with source[p]/k == t (the backward of PermuteRows).
void PermuteRowsBackward(const float* dout, const ExpertPermutation& permutation, float* dx, int d);

// out[t, :] += gates[source[p]] * y[p, :]  (y [T*k, d] in permuted order, gates [T*k] in slot
// order).
void UnpermuteAdd(const float* y, const ExpertPermutation& permutation, const float* gates,
                  float* out, int d);

// dy[p, :] += gates[s] * dout[t, :] ; dgates[s] += dot(y[p, :], dout[t, :]) with s = source[p],
// t = s / k. dy or dgates may be nullptr.
void UnpermuteAddBackward(const float* y, const ExpertPermutation& permutation, const float* gates,
                          const float* dout, float* dy, float* dgates, int d);

}  // namespace tandem::cpu

#endif  // TANDEM_KERNELS_CPU_PERMUTE_H_
