#include "kernels/cpu/rope.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

namespace tandem::cpu {
namespace {

// The rotation is orthogonal, so the gradient of scale·R·x is scale·Rᵀ·dy: the rotation by the
// negated angle, which sign = -1 selects.
void Rotate(float* x, const int* positions, int tokens, int heads, const RopeFrequencies& rope,
            double sign) {
  const int half = static_cast<int>(rope.inv_freq.size());
  const int head_dim = 2 * half;
  // Every head of a token shares the same angles, so the trig is done once per token.
  std::vector<float> cos_a(half), sin_a(half);
  for (int t = 0; t < tokens; ++t) {
    for (int i = 0; i < half; ++i) {
      const double angle = positions[t] * rope.inv_freq[i];
      cos_a[i] = static_cast<float>(rope.scale * std::cos(angle));
      sin_a[i] = static_cast<float>(rope.scale * sign * std::sin(angle));
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

// The (fractional) dimension whose wavelength makes `rotations` turns over `max_position`.
double CorrectionDim(double rotations, int dim, double base, int max_position) {
  return dim * std::log(max_position / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
}

}  // namespace

double YarnMscale(double factor, double mscale) {
  return factor <= 1 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

RopeFrequencies RopeFrequencies::Plain(double theta, int head_dim) {
  RopeFrequencies rope;
  for (int i = 0; i < head_dim / 2; ++i)
    rope.inv_freq.push_back(std::pow(theta, -2.0 * i / head_dim));
  return rope;
}

RopeFrequencies RopeFrequencies::Yarn(double theta, int head_dim, const YarnParams& params) {
  const int half = head_dim / 2;
  double low = CorrectionDim(params.beta_fast, head_dim, theta, params.original_max_position);
  double high = CorrectionDim(params.beta_slow, head_dim, theta, params.original_max_position);
  if (params.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, head_dim - 1.0);
  if (low == high) high += 0.001;  // No division by zero in the ramp.
  RopeFrequencies rope;
  for (int i = 0; i < half; ++i) {
    const double extrapolated = std::pow(theta, -2.0 * i / head_dim);
    const double interpolated = extrapolated / params.factor;
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double extrapolation_share = 1.0 - ramp;
    rope.inv_freq.push_back(interpolated * (1 - extrapolation_share) +
                            extrapolated * extrapolation_share);
  }
  if (params.attention_factor > 0) {
    rope.scale = params.attention_factor;
  } else if (params.mscale > 0 && params.mscale_all_dim > 0) {
    rope.scale =
        YarnMscale(params.factor, params.mscale) / YarnMscale(params.factor, params.mscale_all_dim);
  } else {
    rope.scale = YarnMscale(params.factor, 1.0);
  }
  return rope;
}

void Rope(float* x, const int* positions, int tokens, int heads, const RopeFrequencies& rope) {
  Rotate(x, positions, tokens, heads, rope, 1.0);
}

void Rope(float* x, const int* positions, int tokens, int heads, int head_dim, float theta) {
  Rope(x, positions, tokens, heads, RopeFrequencies::Plain(theta, head_dim));
}

void RopeBackward(float* dx, const int* positions, int tokens, int heads,
                  const RopeFrequencies& rope) {
  Rotate(dx, positions, tokens, heads, rope, -1.0);
}

void RopeBackward(float* dx, const int* positions, int tokens, int heads, int head_dim,
                  float theta) {
  RopeBackward(dx, positions, tokens, heads, RopeFrequencies::Plain(theta, head_dim));
}

}  // namespace tandem::cpu
