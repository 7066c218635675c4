#ifndef TANDEM_KERNELS_CUDA_PERMUTE_H_
#define TANDEM_KERNELS_CUDA_PERMUTE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/cuda/device.h"

namespace tandem::cuda {

// cpu::ExpertPermutation in device memory, plus its inverse (`position`), which lets the
// per-token kernels gather their k rows without atomics.
struct DevicePermutation {
  DeviceArray<int> offsets;   // [E+1]: rows of expert e are [offsets[e], offsets[e+1]).
  DeviceArray<int> source;    // [T*k]: permuted row p comes from routing slot source[p] = t*k + j.
  DeviceArray<int> position;  // [T*k]: routing slot s lands on permuted row position[s].
  int tokens = 0;             // Tokens of the last BuildPermutation.
  int capacity = 0;           // Most tokens the arrays hold.
  int k = 0;
  int experts = 0;

  static absl::StatusOr<DevicePermutation> Allocate(int tokens, int k, int experts);
};

// Device twin of cpu::BuildPermutation into `permutation` (allocated for at least T tokens, and
// for k and E): stable (slots of one expert stay in slot order), so offsets and source equal the
// CPU's. ids must be valid routes (cpu::ValidateRoutes); the kernels never write out of bounds for
// a bad id, but its slot gets no row (position -1) and the result is otherwise unspecified.
absl::Status BuildPermutation(const int16_t* ids, int T, int k, int E,
                              DevicePermutation& permutation, Stream stream = nullptr);

// Device twins of the cpu:: functions of the same names (rows of d floats, device memory). The
// backward functions and UnpermuteAdd accumulate; dy or dgates may be null.
absl::Status PermuteRows(const float* x, const DevicePermutation& permutation, float* out, int d,
                         Stream stream = nullptr);
absl::Status PermuteRowsBackward(const float* dout, const DevicePermutation& permutation, float* dx,
                                 int d, Stream stream = nullptr);
absl::Status UnpermuteAdd(const float* y, const DevicePermutation& permutation, const float* gates,
                          float* out, int d, Stream stream = nullptr);
absl::Status UnpermuteAddBackward(const float* y, const DevicePermutation& permutation,
                                  const float* gates, const float* dout, float* dy, float* dgates,
                                  int d, Stream stream = nullptr);

}  // namespace tandem::cuda

#endif  // TANDEM_KERNELS_CUDA_PERMUTE_H_
