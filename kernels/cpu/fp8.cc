#include "kernels/cpu/fp8.h"

#include <algorithm>
#include <cmath>

namespace tandem::cpu {
namespace {

constexpr float kSmallestNormal = 0x1p-6f;  // Below it, subnormals spaced 2^-9 apart.

}  // namespace

float RoundToE4M3(float x) {
  if (std::isnan(x)) return x;
  const float magnitude = std::fabs(x);
  if (magnitude >= kE4M3Max) return std::copysign(kE4M3Max, x);
  int exponent = 0;
  std::frexp(magnitude, &exponent);  // magnitude = m * 2^exponent, m in [0.5, 1).
  // Three mantissa bits: values of the binade [2^(e-1), 2^e) are 2^(e-4) apart.
  const float quantum = magnitude < kSmallestNormal ? 0x1p-9f : std::ldexp(1.0f, exponent - 4);
  // Dividing and multiplying by a power of two is exact; nearbyint rounds ties to even.
  return std::copysign(std::nearbyint(magnitude / quantum) * quantum, x);
}

void QuantizeRowsToE4M3(float* x, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * cols;
    float absmax = 0.0f;
    for (int64_t c = 0; c < cols; ++c) absmax = std::max(absmax, std::fabs(row[c]));
    const float scale = absmax / kE4M3Max;
    // A row so small its scale underflows (denormals) is kept as is: x / 0 would be NaN.
    if (!std::isnormal(scale)) continue;
    for (int64_t c = 0; c < cols; ++c) row[c] = RoundToE4M3(row[c] / scale) * scale;
  }
}

}  // namespace tandem::cpu
