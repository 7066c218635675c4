#include "kernels/cpu/permute.h"

#include <cblas.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace tandem::cpu {
namespace {

// An id outside [0, E) would index past offsets; failing loudly beats a corrupt dispatch.
void CheckExpertId(int id, int slot, int E) {
  if (id >= 0 && id < E) return;
  std::fprintf(stderr, "BuildPermutation: slot %d has expert %d, out of range [0, %d)\n", slot, id,
               E);
  std::abort();
}

int Rows(const ExpertPermutation& permutation) {
  return static_cast<int>(permutation.source.size());
}

int64_t TokenRow(const ExpertPermutation& permutation, int p, int d) {
  return int64_t{permutation.source[p] / permutation.k} * d;
}

void AddScaled(float alpha, const float* x, float* y, int d) {
  for (int c = 0; c < d; ++c) y[c] += alpha * x[c];
}

}  // namespace

ExpertPermutation BuildPermutation(const int16_t* ids, int T, int k, int E) {
  const int slots = T * k;
  ExpertPermutation permutation;
  permutation.k = k;
  permutation.offsets.assign(E + 1, 0);
  for (int s = 0; s < slots; ++s) {
    CheckExpertId(ids[s], s, E);
    ++permutation.offsets[ids[s] + 1];
  }
  for (int e = 0; e < E; ++e) permutation.offsets[e + 1] += permutation.offsets[e];
  // A counting sort visiting slots in ascending order is what makes the permutation stable.
  std::vector<int> cursor(permutation.offsets.begin(), permutation.offsets.end() - 1);
  permutation.source.resize(slots);
  for (int s = 0; s < slots; ++s) permutation.source[cursor[ids[s]]++] = s;
  return permutation;
}

void PermuteRows(const float* x, const ExpertPermutation& permutation, float* out, int d) {
  const int rows = Rows(permutation);
  for (int p = 0; p < rows; ++p) {
    std::memcpy(out + int64_t{p} * d, x + TokenRow(permutation, p, d), sizeof(float) * d);
  }
}

void PermuteRowsBackward(const float* dout, const ExpertPermutation& permutation, float* dx,
                         int d) {
  const int rows = Rows(permutation);
  for (int p = 0; p < rows; ++p) {
    AddScaled(1.0f, dout + int64_t{p} * d, dx + TokenRow(permutation, p, d), d);
  }
}

void UnpermuteAdd(const float* y, const ExpertPermutation& permutation, const float* gates,
                  float* out, int d) {
  const int rows = Rows(permutation);
  for (int p = 0; p < rows; ++p) {
    const float gate = gates[permutation.source[p]];
    AddScaled(gate, y + int64_t{p} * d, out + TokenRow(permutation, p, d), d);
  }
}

void UnpermuteAddBackward(const float* y, const ExpertPermutation& permutation, const float* gates,
                          const float* dout, float* dy, float* dgates, int d) {
  const int rows = Rows(permutation);
  for (int p = 0; p < rows; ++p) {
    const int s = permutation.source[p];
    const float* dout_row = dout + TokenRow(permutation, p, d);
    if (dy != nullptr) AddScaled(gates[s], dout_row, dy + int64_t{p} * d, d);
    // sdot's blocked accumulation is both faster and more accurate than a serial float sum.
    if (dgates != nullptr) dgates[s] += cblas_sdot(d, y + int64_t{p} * d, 1, dout_row, 1);
  }
}

}  // namespace tandem::cpu
