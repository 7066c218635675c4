#ifndef TANDEM_KERNELS_CPU_ROPE_H_
#define TANDEM_KERNELS_CPU_ROPE_H_

#include <vector>

namespace tandem::cpu {

// YaRN's parameters (transformers' rope_scaling {"rope_type": "yarn", ...}).
struct YarnParams {
  double factor = 1.0;
  int original_max_position = 0;  // original_max_position_embeddings.
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  // The scale of the rotated values; 0 derives it: 0.1·ln(factor) + 1, or with mscale and
  // mscale_all_dim (both > 0) get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim).
  double attention_factor = 0.0;
  double mscale = 0.0;
  double mscale_all_dim = 0.0;
  bool truncate = true;  // Round the correction range to whole dimensions.
};

// YaRN's get_mscale: 0.1·mscale·ln(factor) + 1, or 1 for factor <= 1.
double YarnMscale(double factor, double mscale);

// The rotation frequencies of RoPE, one per pair of dimensions (head_dim / 2), and the scale the
// rotated values are multiplied by.
struct RopeFrequencies {
  std::vector<double> inv_freq;
  double scale = 1.0;

  // Plain RoPE: inv_freq[i] = theta^(-2i/head_dim), scale 1.
  static RopeFrequencies Plain(double theta, int head_dim);
  // YaRN as transformers' _compute_yarn_parameters computes it: frequencies blended between
  // interpolated (divided by factor) and extrapolated ones by a linear ramp over the correction
  // range of beta_fast..beta_slow rotations, and the attention factor as scale.
  static RopeFrequencies Yarn(double theta, int head_dim, const YarnParams& params);
};

// Rotary position embedding in the "rotate half" (GPT-NeoX / HF Llama) convention: element i
// pairs with i + head_dim/2 and turns by positions[t] * inv_freq[i], then both are multiplied by
// the scale; head_dim = 2 * inv_freq.size(). Angles, cosines and sines are computed in double,
// so large positions stay accurate.

// Rotates x [tokens, heads, head_dim] in place; positions[tokens] are absolute positions.
void Rope(float* x, const int* positions, int tokens, int heads, const RopeFrequencies& rope);
// The same with plain RoPE of base theta.
void Rope(float* x, const int* positions, int tokens, int heads, int head_dim, float theta);

// Gradient through Rope, in place: the transposed (inverse) rotation, scaled alike.
void RopeBackward(float* dx, const int* positions, int tokens, int heads,
                  const RopeFrequencies& rope);
void RopeBackward(float* dx, const int* positions, int tokens, int heads, int head_dim,
                  float theta);

}  // namespace tandem::cpu

#endif  // TANDEM_KERNELS_CPU_ROPE_H_
