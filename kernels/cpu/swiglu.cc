#include "kernels/cpu/swiglu.h"

#include <cmath>

namespace tandem::cpu {
namespace {

// exp(-x) overflows to inf for x < -88, which still gives the right limit, 0.
inline float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

void SwiGlu(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] * Sigmoid(gate[i]) * up[i];
}

// silu'(g) = σ(g) (1 + g (1 - σ(g))).
void SwiGluBackward(const float* gate, const float* up, const float* dout, float* dgate, float* dup,
                    int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float s = Sigmoid(g);
    if (dgate != nullptr) dgate[i] += dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
    if (dup != nullptr) dup[i] += dout[i] * g * s;
  }
}

}  // namespace tandem::cpu
