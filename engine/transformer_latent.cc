// DeepSeek's multi-head latent attention (MLA), as modeling_deepseek_v3.py computes it: the
// projections from a layer's normalized input to the queries, keys and values the attention
// kernels take, and their backward. The attention itself is the shared kernel, with keys of
// qk_nope_head_dim + qk_rope_head_dim and values of v_head_dim (ModelConfig::attention_shape).
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/transformer.h"
#include "engine/transformer_activations.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"

namespace tandem::engine {
namespace {

// transformers builds q_a_layernorm and kv_a_layernorm with DeepseekV3RMSNorm's default epsilon,
// not the config's rms_norm_eps.
constexpr float kLatentNormEps = 1e-6f;

// transformers' apply_rotary_pos_emb_interleave reorders each rotary vector [x0, x1, x2, x3, ...]
// to [x0, x2, ..., x1, x3, ...] before rotate-half RoPE and keeps that order; Reinterleave is the
// inverse, for gradients.
void Deinterleave(float* x, int width, int64_t count) {
  std::vector<float> reordered(width);
  for (int64_t n = 0; n < count; ++n) {
    float* v = x + n * width;
    for (int i = 0; i < width / 2; ++i) {
      reordered[i] = v[2 * i];
      reordered[width / 2 + i] = v[2 * i + 1];
    }
    std::copy(reordered.begin(), reordered.end(), v);
  }
}

void Reinterleave(float* x, int width, int64_t count) {
  std::vector<float> original(width);
  for (int64_t n = 0; n < count; ++n) {
    float* v = x + n * width;
    for (int i = 0; i < width / 2; ++i) {
      original[2 * i] = v[i];
      original[2 * i + 1] = v[width / 2 + i];
    }
    std::copy(original.begin(), original.end(), v);
  }
}

// Copies columns [begin, begin + width) of `rows` rows of stride `stride` into a compact array.
std::vector<float> Columns(const float* x, int64_t rows, int stride, int begin, int width) {
  std::vector<float> out(rows * width);
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(x + r * stride + begin, width, out.data() + r * width);
  }
  return out;
}

}  // namespace

void Transformer::RunLatentProjections(int layer, const int* positions, int rows,
                                       LayerActivations& act) {
  const int d = config_.d_model, heads = config_.num_heads;
  const int nope = config_.qk_nope_head_dim, rope = config_.qk_rope_head_dim;
  const int v_dim = config_.v_head_dim, qk = nope + rope, latent = config_.kv_lora_rank;
  const std::string prefix = absl::StrCat("model.layers.", layer, ".self_attn.");
  // Queries [rows, heads, qk].
  std::vector<float>& q = act.q;
  q.resize(int64_t{rows} * heads * qk);
  if (config_.q_lora_rank > 0) {
    const int rank = config_.q_lora_rank;
    act.latent_q_a.resize(int64_t{rows} * rank);
    cpu::Linear(act.norm1.data(), Weight(prefix + "q_a_proj.weight").value.data(),
                act.latent_q_a.data(), rows, d, rank);
    Round(act.latent_q_a.data(), act.latent_q_a.size());
    act.latent_q_a_norm.resize(act.latent_q_a.size());
    act.latent_q_a_rstd.resize(rows);
    cpu::RmsNorm(act.latent_q_a.data(), Weight(prefix + "q_a_layernorm.weight").value.data(),
                 act.latent_q_a_norm.data(), act.latent_q_a_rstd.data(), rows, rank,
                 kLatentNormEps);
    Round(act.latent_q_a_norm.data(), act.latent_q_a_norm.size());
    QuantizeInput(act.latent_q_a_norm.data(), rows, rank);
    cpu::Linear(act.latent_q_a_norm.data(), Weight(prefix + "q_b_proj.weight").value.data(),
                q.data(), rows, rank, heads * qk);
  } else {
    cpu::Linear(act.norm1.data(), Weight(prefix + "q_proj.weight").value.data(), q.data(), rows, d,
                heads * qk);
  }
  Round(q.data(), q.size());
  // The compressed vector and the rotary key every head shares [rows, latent + rope].
  act.latent_ckv.resize(int64_t{rows} * (latent + rope));
  cpu::Linear(act.norm1.data(), Weight(prefix + "kv_a_proj_with_mqa.weight").value.data(),
              act.latent_ckv.data(), rows, d, latent + rope);
  Round(act.latent_ckv.data(), act.latent_ckv.size());
  act.latent_c = Columns(act.latent_ckv.data(), rows, latent + rope, 0, latent);
  act.latent_c_norm.resize(act.latent_c.size());
  act.latent_c_rstd.resize(rows);
  cpu::RmsNorm(act.latent_c.data(), Weight(prefix + "kv_a_layernorm.weight").value.data(),
               act.latent_c_norm.data(), act.latent_c_rstd.data(), rows, latent, kLatentNormEps);
  Round(act.latent_c_norm.data(), act.latent_c_norm.size());
  QuantizeInput(act.latent_c_norm.data(), rows, latent);
  // Per-head keys (their non-rotary part) and values [rows, heads, nope + v_dim].
  act.latent_kv.resize(int64_t{rows} * heads * (nope + v_dim));
  cpu::Linear(act.latent_c_norm.data(), Weight(prefix + "kv_b_proj.weight").value.data(),
              act.latent_kv.data(), rows, latent, heads * (nope + v_dim));
  Round(act.latent_kv.data(), act.latent_kv.size());

  // RoPE on the rotary parts.
  std::vector<float> q_rope = Columns(q.data(), int64_t{rows} * heads, qk, nope, rope);
  std::vector<float> k_rope = Columns(act.latent_ckv.data(), rows, latent + rope, latent, rope);
  if (config_.rope_interleave) {
    Deinterleave(q_rope.data(), rope, int64_t{rows} * heads);
    Deinterleave(k_rope.data(), rope, rows);
  }
  cpu::Rope(q_rope.data(), positions, rows, heads, rope_);
  cpu::Rope(k_rope.data(), positions, rows, 1, rope_);

  act.k.resize(q.size());
  act.v.resize(int64_t{rows} * heads * v_dim);
  for (int64_t t = 0; t < rows; ++t) {
    for (int h = 0; h < heads; ++h) {
      const int64_t row = t * heads + h;
      const float* kv = act.latent_kv.data() + row * (nope + v_dim);
      std::copy_n(q_rope.data() + row * rope, rope, q.data() + row * qk + nope);
      std::copy_n(kv, nope, act.k.data() + row * qk);
      std::copy_n(k_rope.data() + t * rope, rope, act.k.data() + row * qk + nope);
      std::copy_n(kv + nope, v_dim, act.v.data() + row * v_dim);
    }
  }
}

void Transformer::BackwardLatentProjections(int layer, LayerActivations& act,
                                            std::vector<float>& dq, std::vector<float>& dk,
                                            const std::vector<float>& dv, float* dnorm1) {
  const int rows = static_cast<int>(tokens_.size());
  const int d = config_.d_model, heads = config_.num_heads;
  const int nope = config_.qk_nope_head_dim, rope = config_.qk_rope_head_dim;
  const int v_dim = config_.v_head_dim, qk = nope + rope, latent = config_.kv_lora_rank;
  const std::string prefix = absl::StrCat("model.layers.", layer, ".self_attn.");

  // Through RoPE: the queries' rotary parts per head, the shared key's summed over heads.
  std::vector<float> dq_rope = Columns(dq.data(), int64_t{rows} * heads, qk, nope, rope);
  std::vector<float> dk_rope(int64_t{rows} * rope, 0.0f);
  for (int64_t t = 0; t < rows; ++t) {
    for (int h = 0; h < heads; ++h) {
      const float* from = dk.data() + (t * heads + h) * qk + nope;
      for (int i = 0; i < rope; ++i) dk_rope[t * rope + i] += from[i];
    }
  }
  cpu::RopeBackward(dq_rope.data(), positions_.data(), rows, heads, rope_);
  cpu::RopeBackward(dk_rope.data(), positions_.data(), rows, 1, rope_);
  if (config_.rope_interleave) {
    Reinterleave(dq_rope.data(), rope, int64_t{rows} * heads);
    Reinterleave(dk_rope.data(), rope, rows);
  }
  for (int64_t row = 0; row < int64_t{rows} * heads; ++row) {
    std::copy_n(dq_rope.data() + row * rope, rope, dq.data() + row * qk + nope);
  }

  // Keys and values back to the compressed vector.
  std::vector<float> dkv(act.latent_kv.size());
  for (int64_t row = 0; row < int64_t{rows} * heads; ++row) {
    std::copy_n(dk.data() + row * qk, nope, dkv.data() + row * (nope + v_dim));
    std::copy_n(dv.data() + row * v_dim, v_dim, dkv.data() + row * (nope + v_dim) + nope);
  }
  std::vector<float> dc_norm(act.latent_c_norm.size(), 0.0f), dc(act.latent_c.size(), 0.0f);
  Parameter& kv_b = Weight(prefix + "kv_b_proj.weight");
  cpu::LinearBackward(act.latent_c_norm.data(), kv_b.value.data(), dkv.data(), dc_norm.data(),
                      kv_b.grad_or_null(), rows, latent, heads * (nope + v_dim));
  Parameter& kv_norm = Weight(prefix + "kv_a_layernorm.weight");
  cpu::RmsNormBackward(act.latent_c.data(), kv_norm.value.data(), act.latent_c_rstd.data(),
                       dc_norm.data(), dc.data(), kv_norm.grad_or_null(), rows, latent);
  std::vector<float> dckv(act.latent_ckv.size());
  for (int64_t t = 0; t < rows; ++t) {
    std::copy_n(dc.data() + t * latent, latent, dckv.data() + t * (latent + rope));
    std::copy_n(dk_rope.data() + t * rope, rope, dckv.data() + t * (latent + rope) + latent);
  }
  Parameter& kv_a = Weight(prefix + "kv_a_proj_with_mqa.weight");
  cpu::LinearBackward(act.norm1.data(), kv_a.value.data(), dckv.data(), dnorm1, kv_a.grad_or_null(),
                      rows, d, latent + rope);

  // Queries.
  if (config_.q_lora_rank == 0) {
    Parameter& q_proj = Weight(prefix + "q_proj.weight");
    cpu::LinearBackward(act.norm1.data(), q_proj.value.data(), dq.data(), dnorm1,
                        q_proj.grad_or_null(), rows, d, heads * qk);
    return;
  }
  const int rank = config_.q_lora_rank;
  std::vector<float> dq_a_norm(act.latent_q_a_norm.size(), 0.0f), dq_a(act.latent_q_a.size(), 0.0f);
  Parameter& q_b = Weight(prefix + "q_b_proj.weight");
  cpu::LinearBackward(act.latent_q_a_norm.data(), q_b.value.data(), dq.data(), dq_a_norm.data(),
                      q_b.grad_or_null(), rows, rank, heads * qk);
  Parameter& q_norm = Weight(prefix + "q_a_layernorm.weight");
  cpu::RmsNormBackward(act.latent_q_a.data(), q_norm.value.data(), act.latent_q_a_rstd.data(),
                       dq_a_norm.data(), dq_a.data(), q_norm.grad_or_null(), rows, rank);
  Parameter& q_a = Weight(prefix + "q_a_proj.weight");
  cpu::LinearBackward(act.norm1.data(), q_a.value.data(), dq_a.data(), dnorm1, q_a.grad_or_null(),
                      rows, d, rank);
}

}  // namespace tandem::engine
