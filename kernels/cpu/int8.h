#ifndef TANDEM_KERNELS_CPU_INT8_H_
#define TANDEM_KERNELS_CPU_INT8_H_

#include <cstdint>

// Symmetric INT8 weight quantization as fake quantization in float: every value is replaced by
// the value an INT8 weight with a per-row scale dequantizes to, so a CPU run computes what a
// W8A16 GEMM (INT8 weights, 16-bit activations, as vLLM runs INT8 weight-only models) computes.

namespace tandem::cpu {

inline constexpr float kInt8Max = 127.0f;

// Quantizes each of `rows` rows of `cols` values with its own scale (absmax / 127), the
// per-output-channel scaling of a [out, in] weight: x = clamp(round(x / scale), -127, 127) *
// scale, rounding half to even. A row of zeros, or of values so small that the scale would
// underflow, stays as it is; NaN stays NaN.
void QuantizeRowsToInt8(float* x, int64_t rows, int64_t cols);

}  // namespace tandem::cpu

#endif  // TANDEM_KERNELS_CPU_INT8_H_
