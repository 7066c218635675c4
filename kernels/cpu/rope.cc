#include "kernels/cpu/rope.h"

#include <cmath>
#include <cstdint>
#include <vector>

namespace tandem::cpu {
namespace {

// The rotation is orthogonal, so its gradient is the rotation by the negated angle; sign = -1
// selects that.
void Rotate(float* x, const int* positions, int tokens, int heads, int head_dim, float theta,
            double sign) {
  const int half = head_dim / 2;
  std::vector<double> inv_freq(half);
  for (int i = 0; i < half; ++i) inv_freq[i] = std::pow(double{theta}, -2.0 * i / head_dim);
  // Every head of a token shares the same angles, so the trig is done once per token.
  std::vector<float> cos_a(half), sin_a(half);
  for (int t = 0; t < tokens; ++t) {
    for (int i = 0; i < half; ++i) {
      const double angle = positions[t] * inv_freq[i];
      cos_a[i] = static_cast<float>(std::cos(angle));
      sin_a[i] = static_cast<float>(sign * std::sin(angle));
    }
    for (int h = 0; h < heads; ++h) {
      float* v = x + (static_cast<int64_t>(t) * heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const float a = v[i];
        const float b = v[i + half];
        v[i] = a * cos_a[i] - b * sin_a[i];
        v[i + half] = b * cos_a[i] + a * sin_a[i];
      }
    }
  }
}

}  // namespace

void Rope(float* x, const int* positions, int tokens, int heads, int head_dim, float theta) {
  Rotate(x, positions, tokens, heads, head_dim, theta, 1.0);
}

void RopeBackward(float* dx, const int* positions, int tokens, int heads, int head_dim,
                  float theta) {
  Rotate(dx, positions, tokens, heads, head_dim, theta, -1.0);
}

}  // namespace tandem::cpu
