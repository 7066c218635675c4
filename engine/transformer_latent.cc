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

namespace tandem::engine {
namespace {

// transformers builds q_a_layernorm and kv_a_layernorm with DeepseekV3RMSNorm's default epsilon,
// not the config's rms_norm_eps.
constexpr float kLatentNormEps = 1e-6f;

// Columns [begin, begin + width) of `rows` rows of `stride` floats, as a compact array.
std::vector<float> Columns(ModelOps& ops, const float* x, int64_t rows, int stride, int begin,
                           int width) {
  std::vector<float> out(rows * width);
  ops.CopyColumns(x + begin, stride, out.data(), width, rows, width, /*accumulate=*/false);
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
    ops_->Linear(act.norm1.data(), Weight(prefix + "q_a_proj.weight").value.data(),
                 act.latent_q_a.data(), rows, d, rank, /*accumulate=*/false);
    Round(act.latent_q_a.data(), act.latent_q_a.size());
    act.latent_q_a_norm.resize(act.latent_q_a.size());
    act.latent_q_a_rstd.resize(rows);
    ops_->RmsNorm(act.latent_q_a.data(), Weight(prefix + "q_a_layernorm.weight").value.data(),
                  act.latent_q_a_norm.data(), act.latent_q_a_rstd.data(), rows, rank,
                  kLatentNormEps);
    Round(act.latent_q_a_norm.data(), act.latent_q_a_norm.size());
    QuantizeInput(act.latent_q_a_norm.data(), rows, rank);
    ops_->Linear(act.latent_q_a_norm.data(), Weight(prefix + "q_b_proj.weight").value.data(),
                 q.data(), rows, rank, heads * qk, /*accumulate=*/false);
  } else {
    ops_->Linear(act.norm1.data(), Weight(prefix + "q_proj.weight").value.data(), q.data(), rows, d,
                 heads * qk, /*accumulate=*/false);
  }
  Round(q.data(), q.size());
  // The compressed vector and the rotary key every head shares [rows, latent + rope].
  act.latent_ckv.resize(int64_t{rows} * (latent + rope));
  ops_->Linear(act.norm1.data(), Weight(prefix + "kv_a_proj_with_mqa.weight").value.data(),
               act.latent_ckv.data(), rows, d, latent + rope, /*accumulate=*/false);
  Round(act.latent_ckv.data(), act.latent_ckv.size());
  act.latent_c = Columns(*ops_, act.latent_ckv.data(), rows, latent + rope, 0, latent);
  act.latent_c_norm.resize(act.latent_c.size());
  act.latent_c_rstd.resize(rows);
  ops_->RmsNorm(act.latent_c.data(), Weight(prefix + "kv_a_layernorm.weight").value.data(),
                act.latent_c_norm.data(), act.latent_c_rstd.data(), rows, latent, kLatentNormEps);
  Round(act.latent_c_norm.data(), act.latent_c_norm.size());
  QuantizeInput(act.latent_c_norm.data(), rows, latent);
  // Per-head keys (their non-rotary part) and values [rows, heads, nope + v_dim].
  act.latent_kv.resize(int64_t{rows} * heads * (nope + v_dim));
  ops_->Linear(act.latent_c_norm.data(), Weight(prefix + "kv_b_proj.weight").value.data(),
               act.latent_kv.data(), rows, latent, heads * (nope + v_dim), /*accumulate=*/false);
  Round(act.latent_kv.data(), act.latent_kv.size());

  // RoPE on the rotary parts.
  std::vector<float> q_rope = Columns(*ops_, q.data(), int64_t{rows} * heads, qk, nope, rope);
  std::vector<float> k_rope =
      Columns(*ops_, act.latent_ckv.data(), rows, latent + rope, latent, rope);
  if (config_.rope_interleave) {  // transformers' apply_rotary_pos_emb_interleave order.
    ops_->Deinterleave(q_rope.data(), rope, int64_t{rows} * heads);
    ops_->Deinterleave(k_rope.data(), rope, rows);
  }
  ops_->Rope(q_rope.data(), positions, rows, heads);
  ops_->Rope(k_rope.data(), positions, rows, 1);

  act.k.resize(q.size());
  act.v.resize(int64_t{rows} * heads * v_dim);
  const int64_t head_rows = int64_t{rows} * heads;
  ops_->CopyColumns(q_rope.data(), rope, q.data() + nope, qk, head_rows, rope, false);
  ops_->CopyColumns(act.latent_kv.data(), nope + v_dim, act.k.data(), qk, head_rows, nope, false);
  for (int h = 0; h < heads; ++h) {  // Every head shares the rotary key.
    ops_->CopyColumns(k_rope.data(), rope, act.k.data() + int64_t{h} * qk + nope,
                      int64_t{heads} * qk, rows, rope, false);
  }
  ops_->CopyColumns(act.latent_kv.data() + nope, nope + v_dim, act.v.data(), v_dim, head_rows,
                    v_dim, false);
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
  std::vector<float> dq_rope = Columns(*ops_, dq.data(), int64_t{rows} * heads, qk, nope, rope);
  std::vector<float> dk_rope(int64_t{rows} * rope, 0.0f);
  for (int h = 0; h < heads; ++h) {
    ops_->CopyColumns(dk.data() + int64_t{h} * qk + nope, int64_t{heads} * qk, dk_rope.data(), rope,
                      rows, rope, /*accumulate=*/true);
  }
  ops_->RopeBackward(dq_rope.data(), positions_.data(), rows, heads);
  ops_->RopeBackward(dk_rope.data(), positions_.data(), rows, 1);
  if (config_.rope_interleave) {
    ops_->Reinterleave(dq_rope.data(), rope, int64_t{rows} * heads);
    ops_->Reinterleave(dk_rope.data(), rope, rows);
  }
  const int64_t head_rows = int64_t{rows} * heads;
  ops_->CopyColumns(dq_rope.data(), rope, dq.data() + nope, qk, head_rows, rope, false);

  // Keys and values back to the compressed vector.
  std::vector<float> dkv(act.latent_kv.size());
  ops_->CopyColumns(dk.data(), qk, dkv.data(), nope + v_dim, head_rows, nope, false);
  ops_->CopyColumns(dv.data(), v_dim, dkv.data() + nope, nope + v_dim, head_rows, v_dim, false);
  std::vector<float> dc_norm(act.latent_c_norm.size(), 0.0f), dc(act.latent_c.size(), 0.0f);
  Parameter& kv_b = Weight(prefix + "kv_b_proj.weight");
  ops_->LinearBackward(act.latent_c_norm.data(), kv_b.value.data(), dkv.data(), dc_norm.data(),
                       kv_b.grad_or_null(), rows, latent, heads * (nope + v_dim));
  Parameter& kv_norm = Weight(prefix + "kv_a_layernorm.weight");
  ops_->RmsNormBackward(act.latent_c.data(), kv_norm.value.data(), act.latent_c_rstd.data(),
                        dc_norm.data(), dc.data(), kv_norm.grad_or_null(), rows, latent);
  std::vector<float> dckv(act.latent_ckv.size());
  ops_->CopyColumns(dc.data(), latent, dckv.data(), latent + rope, rows, latent, false);
  ops_->CopyColumns(dk_rope.data(), rope, dckv.data() + latent, latent + rope, rows, rope, false);
  Parameter& kv_a = Weight(prefix + "kv_a_proj_with_mqa.weight");
  ops_->LinearBackward(act.norm1.data(), kv_a.value.data(), dckv.data(), dnorm1,
                       kv_a.grad_or_null(), rows, d, latent + rope);

  // Queries.
  if (config_.q_lora_rank == 0) {
    Parameter& q_proj = Weight(prefix + "q_proj.weight");
    ops_->LinearBackward(act.norm1.data(), q_proj.value.data(), dq.data(), dnorm1,
                         q_proj.grad_or_null(), rows, d, heads * qk);
    return;
  }
  const int rank = config_.q_lora_rank;
  std::vector<float> dq_a_norm(act.latent_q_a_norm.size(), 0.0f), dq_a(act.latent_q_a.size(), 0.0f);
  Parameter& q_b = Weight(prefix + "q_b_proj.weight");
  ops_->LinearBackward(act.latent_q_a_norm.data(), q_b.value.data(), dq.data(), dq_a_norm.data(),
                       q_b.grad_or_null(), rows, rank, heads * qk);
  Parameter& q_norm = Weight(prefix + "q_a_layernorm.weight");
  ops_->RmsNormBackward(act.latent_q_a.data(), q_norm.value.data(), act.latent_q_a_rstd.data(),
                        dq_a_norm.data(), dq_a.data(), q_norm.grad_or_null(), rows, rank);
  Parameter& q_a = Weight(prefix + "q_a_proj.weight");
  ops_->LinearBackward(act.norm1.data(), q_a.value.data(), dq_a.data(), dnorm1, q_a.grad_or_null(),
                       rows, d, rank);
}

}  // namespace tandem::engine
