#include "kernels/cpu/rmsnorm.h"

#include <cmath>
#include <cstdint>

namespace tandem::cpu {

void RmsNorm(const float* x, const float* weight, float* y, float* rstd, int rows, int dim,
             float eps) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<int64_t>(r) * dim;
    float* yr = y + static_cast<int64_t>(r) * dim;
    // Double keeps the mean square exact enough for wide rows at negligible cost.
    double sum_sq = 0.0;
    for (int i = 0; i < dim; ++i) sum_sq += static_cast<double>(xr[i]) * xr[i];
    const float s = static_cast<float>(1.0 / std::sqrt(sum_sq / dim + eps));
    for (int i = 0; i < dim; ++i) yr[i] = xr[i] * s * weight[i];
    if (rstd != nullptr) rstd[r] = s;
  }
}

// With s = rstd and y_i = x_i s w_i, ∂s/∂x_i = -s³ x_i / dim, so
// dx_i = s w_i dy_i - x_i s³ / dim · Σ_j dy_j w_j x_j.
void RmsNormBackward(const float* x, const float* weight, const float* rstd, const float* dy,
                     float* dx, float* dweight, int rows, int dim) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<int64_t>(r) * dim;
    const float* dyr = dy + static_cast<int64_t>(r) * dim;
    const float s = rstd[r];
    if (dweight != nullptr) {
      for (int i = 0; i < dim; ++i) dweight[i] += dyr[i] * xr[i] * s;
    }
    if (dx == nullptr) continue;
    double dot = 0.0;
    for (int i = 0; i < dim; ++i) dot += static_cast<double>(dyr[i]) * weight[i] * xr[i];
    const float coeff = static_cast<float>(dot * s * s * s / dim);
    float* dxr = dx + static_cast<int64_t>(r) * dim;
    for (int i = 0; i < dim; ++i) dxr[i] += s * weight[i] * dyr[i] - xr[i] * coeff;
  }
}

}  // namespace tandem::cpu
