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
Buffer<float> Columns(ModelOps& ops, Ref<const float> x, int64_t rows, int stride, int begin,
                      int width) {
  Buffer<float> out = ops.Allocate<float>(rows * width);
  ops.CopyColumns(x + begin, stride, out.ref(), width, rows, width, /*accumulate=*/false);
  return out;
}

}  // namespace

void Transformer::RunLatentProjections(int layer, int rows, LayerActivations& act) {
  const int d = config_.d_model, heads = config_.num_heads;
  const int nope = config_.qk_nope_head_dim, rope = config_.qk_rope_head_dim;
  const int v_dim = config_.v_head_dim, qk = nope + rope, latent = config_.kv_lora_rank;
  const std::string prefix = absl::StrCat("model.layers.", layer, ".self_attn.");
  // Queries [rows, heads, qk].
  Buffer<float>& q = act.q;
  ops_->Resize(q, int64_t{rows} * heads * qk);
  if (config_.q_lora_rank > 0) {
    const int rank = config_.q_lora_rank;
    ops_->Resize(act.latent_q_a, int64_t{rows} * rank);
    ops_->Linear(act.norm1.ref(), Weight(prefix + "q_a_proj.weight"), act.latent_q_a.ref(), rows, d,
                 rank, /*accumulate=*/false);
    Round(act.latent_q_a.ref(), act.latent_q_a.size());
    ops_->Resize(act.latent_q_a_norm, act.latent_q_a.size());
    ops_->Resize(act.latent_q_a_rstd, rows);
    ops_->RmsNorm(act.latent_q_a.ref(), Weight(prefix + "q_a_layernorm.weight"),
                  act.latent_q_a_norm.ref(), act.latent_q_a_rstd.ref(), rows, rank, kLatentNormEps);
    Round(act.latent_q_a_norm.ref(), act.latent_q_a_norm.size());
    QuantizeInput(act.latent_q_a_norm.ref(), rows, rank);
    ops_->Linear(act.latent_q_a_norm.ref(), Weight(prefix + "q_b_proj.weight"), q.ref(), rows, rank,
                 heads * qk, /*accumulate=*/false);
  } else {
    ops_->Linear(act.norm1.ref(), Weight(prefix + "q_proj.weight"), q.ref(), rows, d, heads * qk,
                 /*accumulate=*/false);
  }
  Round(q.ref(), q.size());
  // The compressed vector and the rotary key every head shares [rows, latent + rope].
  ops_->Resize(act.latent_ckv, int64_t{rows} * (latent + rope));
  ops_->Linear(act.norm1.ref(), Weight(prefix + "kv_a_proj_with_mqa.weight"), act.latent_ckv.ref(),
               rows, d, latent + rope, /*accumulate=*/false);
  Round(act.latent_ckv.ref(), act.latent_ckv.size());
  act.latent_c = Columns(*ops_, act.latent_ckv.ref(), rows, latent + rope, 0, latent);
  ops_->Resize(act.latent_c_norm, act.latent_c.size());
  ops_->Resize(act.latent_c_rstd, rows);
  ops_->RmsNorm(act.latent_c.ref(), Weight(prefix + "kv_a_layernorm.weight"),
                act.latent_c_norm.ref(), act.latent_c_rstd.ref(), rows, latent, kLatentNormEps);
  Round(act.latent_c_norm.ref(), act.latent_c_norm.size());
  QuantizeInput(act.latent_c_norm.ref(), rows, latent);
  // Per-head keys (their non-rotary part) and values [rows, heads, nope + v_dim].
  ops_->Resize(act.latent_kv, int64_t{rows} * heads * (nope + v_dim));
  ops_->Linear(act.latent_c_norm.ref(), Weight(prefix + "kv_b_proj.weight"), act.latent_kv.ref(),
               rows, latent, heads * (nope + v_dim), /*accumulate=*/false);
  Round(act.latent_kv.ref(), act.latent_kv.size());

  // RoPE on the rotary parts.
  Buffer<float> q_rope = Columns(*ops_, q.ref(), int64_t{rows} * heads, qk, nope, rope);
  Buffer<float> k_rope = Columns(*ops_, act.latent_ckv.ref(), rows, latent + rope, latent, rope);
  if (config_.rope_interleave) {  // transformers' apply_rotary_pos_emb_interleave order.
    ops_->Deinterleave(q_rope.ref(), rope, int64_t{rows} * heads);
    ops_->Deinterleave(k_rope.ref(), rope, rows);
  }
  ops_->Rope(q_rope.ref(), position_buffer_.ref(), rows, heads);
  ops_->Rope(k_rope.ref(), position_buffer_.ref(), rows, 1);

  ops_->Resize(act.k, q.size());
  ops_->Resize(act.v, int64_t{rows} * heads * v_dim);
  const int64_t head_rows = int64_t{rows} * heads;
  ops_->CopyColumns(q_rope.ref(), rope, q.ref() + nope, qk, head_rows, rope, false);
  ops_->CopyColumns(act.latent_kv.ref(), nope + v_dim, act.k.ref(), qk, head_rows, nope, false);
  for (int h = 0; h < heads; ++h) {  // Every head shares the rotary key.
    ops_->CopyColumns(k_rope.ref(), rope, act.k.ref() + int64_t{h} * qk + nope, int64_t{heads} * qk,
                      rows, rope, false);
  }
  ops_->CopyColumns(act.latent_kv.ref() + nope, nope + v_dim, act.v.ref(), v_dim, head_rows, v_dim,
                    false);
}

void Transformer::BackwardLatentProjections(int layer, LayerActivations& act, Buffer<float>& dq,
                                            Buffer<float>& dk, const Buffer<float>& dv,
                                            Ref<float> dnorm1) {
  const int rows = static_cast<int>(tokens_.size());
  const int d = config_.d_model, heads = config_.num_heads;
  const int nope = config_.qk_nope_head_dim, rope = config_.qk_rope_head_dim;
  const int v_dim = config_.v_head_dim, qk = nope + rope, latent = config_.kv_lora_rank;
  const std::string prefix = absl::StrCat("model.layers.", layer, ".self_attn.");

  // Through RoPE: the queries' rotary parts per head, the shared key's summed over heads.
  Buffer<float> dq_rope = Columns(*ops_, dq.ref(), int64_t{rows} * heads, qk, nope, rope);
  Buffer<float> dk_rope = ops_->Zeros(int64_t{rows} * rope);
  for (int h = 0; h < heads; ++h) {
    ops_->CopyColumns(dk.ref() + int64_t{h} * qk + nope, int64_t{heads} * qk, dk_rope.ref(), rope,
                      rows, rope, /*accumulate=*/true);
  }
  ops_->RopeBackward(dq_rope.ref(), position_buffer_.ref(), rows, heads);
  ops_->RopeBackward(dk_rope.ref(), position_buffer_.ref(), rows, 1);
  if (config_.rope_interleave) {
    ops_->Reinterleave(dq_rope.ref(), rope, int64_t{rows} * heads);
    ops_->Reinterleave(dk_rope.ref(), rope, rows);
  }
  const int64_t head_rows = int64_t{rows} * heads;
  ops_->CopyColumns(dq_rope.ref(), rope, dq.ref() + nope, qk, head_rows, rope, false);

  // Keys and values back to the compressed vector.
  Buffer<float> dkv = ops_->Zeros(act.latent_kv.size());
  ops_->CopyColumns(dk.ref(), qk, dkv.ref(), nope + v_dim, head_rows, nope, false);
  ops_->CopyColumns(dv.ref(), v_dim, dkv.ref() + nope, nope + v_dim, head_rows, v_dim, false);
  Buffer<float> dc_norm = ops_->Zeros(act.latent_c_norm.size());
  Buffer<float> dc = ops_->Zeros(act.latent_c.size());
  const WeightRef kv_b = Weight(prefix + "kv_b_proj.weight");
  ops_->LinearBackward(act.latent_c_norm.ref(), kv_b, dkv.ref(), dc_norm.ref(), rows, latent,
                       heads * (nope + v_dim));
  const WeightRef kv_norm = Weight(prefix + "kv_a_layernorm.weight");
  ops_->RmsNormBackward(act.latent_c.ref(), kv_norm, act.latent_c_rstd.ref(), dc_norm.ref(),
                        dc.ref(), rows, latent);
  Buffer<float> dckv = ops_->Zeros(act.latent_ckv.size());
  ops_->CopyColumns(dc.ref(), latent, dckv.ref(), latent + rope, rows, latent, false);
  ops_->CopyColumns(dk_rope.ref(), rope, dckv.ref() + latent, latent + rope, rows, rope, false);
  const WeightRef kv_a = Weight(prefix + "kv_a_proj_with_mqa.weight");
  ops_->LinearBackward(act.norm1.ref(), kv_a, dckv.ref(), dnorm1, rows, d, latent + rope);

  // Queries.
  if (config_.q_lora_rank == 0) {
    const WeightRef q_proj = Weight(prefix + "q_proj.weight");
    ops_->LinearBackward(act.norm1.ref(), q_proj, dq.ref(), dnorm1, rows, d, heads * qk);
    return;
  }
  const int rank = config_.q_lora_rank;
  Buffer<float> dq_a_norm = ops_->Zeros(act.latent_q_a_norm.size());
  Buffer<float> dq_a = ops_->Zeros(act.latent_q_a.size());
  const WeightRef q_b = Weight(prefix + "q_b_proj.weight");
  ops_->LinearBackward(act.latent_q_a_norm.ref(), q_b, dq.ref(), dq_a_norm.ref(), rows, rank,
                       heads * qk);
  const WeightRef q_norm = Weight(prefix + "q_a_layernorm.weight");
  ops_->RmsNormBackward(act.latent_q_a.ref(), q_norm, act.latent_q_a_rstd.ref(), dq_a_norm.ref(),
                        dq_a.ref(), rows, rank);
  const WeightRef q_a = Weight(prefix + "q_a_proj.weight");
  ops_->LinearBackward(act.norm1.ref(), q_a, dq_a.ref(), dnorm1, rows, d, rank);
}

}  // namespace tandem::engine
