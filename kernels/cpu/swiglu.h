#ifndef TANDEM_KERNELS_CPU_SWIGLU_H_
#define TANDEM_KERNELS_CPU_SWIGLU_H_

#include <cstdint>

namespace tandem::cpu {

// out = silu(gate) * up elementwise, silu(x) = x * sigmoid(x).
void SwiGlu(const float* gate, const float* up, float* out, int64_t n);

// dgate += dout · up · silu'(gate) and dup += dout · silu(gate); either may be nullptr.
void SwiGluBackward(const float* gate, const float* up, const float* dout, float* dgate, float* dup,
                    int64_t n);

}  // namespace tandem::cpu

#endif  // TANDEM_KERNELS_CPU_SWIGLU_H_
