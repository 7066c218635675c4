#ifndef TANDEM_KERNELS_CPU_FP8_H_
#define TANDEM_KERNELS_CPU_FP8_H_

#include <cstdint>

// FP8 E4M3 (the "fn" variant of OCP FP8, torch.float8_e4m3fn: 4 exponent bits with bias 7, 3
// mantissa bits, no infinities, largest finite 448) as fake quantization in float: every value
// is replaced by the FP8 value it would be stored as, so a CPU run computes what an FP8 GEMM
// with fp32 accumulation computes (what vLLM and SGLang run MoE experts with).

namespace tandem::cpu {

inline constexpr float kE4M3Max = 448.0f;

// The nearest E4M3 value to x, ties to even; magnitudes beyond 448 saturate to ±448; NaN stays
// NaN.
float RoundToE4M3(float x);

// Quantizes each of `rows` rows of `cols` values with its own scale (absmax / 448): the dynamic
// per-token scaling of activations, and the per-output-channel scaling of a [out, in] weight.
// x = RoundToE4M3(x / scale) * scale; a row of zeros, or of values so small that the scale
// would underflow, stays as it is.
void QuantizeRowsToE4M3(float* x, int64_t rows, int64_t cols);

}  // namespace tandem::cpu

#endif  // TANDEM_KERNELS_CPU_FP8_H_
