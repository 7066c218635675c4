#ifndef TANDEM_KERNELS_CPU_ROPE_H_
#define TANDEM_KERNELS_CPU_ROPE_H_

namespace tandem::cpu {

// Rotary position embedding in the "rotate half" (GPT-NeoX / HF Llama) convention: element i
// pairs with i + head_dim/2 and turns by positions[t] * theta^(-2i/head_dim). head_dim is even.
// Angles, cosines and sines are computed in double, so large positions stay accurate.

// Rotates x [tokens, heads, head_dim] in place; positions[tokens] are absolute positions.
void Rope(float* x, const int* positions, int tokens, int heads, int head_dim, float theta);

// Gradient through Rope, in place (applies the inverse rotation to dx).
void RopeBackward(float* dx, const int* positions, int tokens, int heads, int head_dim,
                  float theta);

}  // namespace tandem::cpu

#endif  // TANDEM_KERNELS_CPU_ROPE_H_
