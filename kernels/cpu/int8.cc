#include "kernels/cpu/int8.h"

#include <algorithm>
#include <cmath>

namespace tandem::cpu {

void QuantizeRowsToInt8(float* x, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * cols;
    float absmax = 0.0f;
    for (int64_t c = 0; c < cols; ++c) {
      if (std::isfinite(row[c])) absmax = std::max(absmax, std::abs(row[c]));
    }
    const float scale = absmax / kInt8Max;
    // A row so small its scale underflows (denormals) is kept as is: x / 0 would be NaN.
    if (!std::isnormal(scale)) continue;
    for (int64_t c = 0; c < cols; ++c) {
      if (std::isnan(row[c])) continue;
      const float q = std::clamp(std::nearbyint(row[c] / scale), -kInt8Max, kInt8Max);
      row[c] = q * scale;
    }
  }
}

}  // namespace tandem::cpu
