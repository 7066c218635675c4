#ifndef TANDEM_KERNELS_CPU_RMSNORM_H_
#define TANDEM_KERNELS_CPU_RMSNORM_H_

namespace tandem::cpu {

// y = x / sqrt(mean(x²) + eps) * weight per row; rstd[rows] saved for backward.
void RmsNorm(const float* x, const float* weight, float* y, float* rstd, int rows, int dim,
             float eps);

// dx[rows,dim] += ∂L/∂x and dweight[dim] += ∂L/∂weight given dy = ∂L/∂y and the rstd saved by
// RmsNorm. Either output may be nullptr.
void RmsNormBackward(const float* x, const float* weight, const float* rstd, const float* dy,
                     float* dx, float* dweight, int rows, int dim);

}  // namespace tandem::cpu

#endif  // TANDEM_KERNELS_CPU_RMSNORM_H_
