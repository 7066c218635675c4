// CudaTransformer::Backward: engine::Transformer's backward (transformer.cc) step for step, for a
// frozen base model: only the adapter gets gradients, every input gradient flows through.

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_transformer.h"
#include "engine/cuda/cuda_transformer_state.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/grouped_lora.h"
#include "kernels/cuda/permute.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/router.h"
#include "kernels/cuda/swiglu.h"

namespace tandem::engine::cuda {
namespace {

// A zeroed gradient buffer for one backward step.
absl::StatusOr<DeviceArray<float>> Zeros(int64_t size) {
  DeviceArray<float> array;
  if (absl::Status status = Allocate(array, size); !status.ok()) return status;
  return array;
}

}  // namespace

absl::Status CudaTransformer::Backward(const float* dlogits, const float* dhidden) {
  if (pass_ == nullptr || pass_->mode != PassMode::kPackedSequences) {
    return absl::FailedPreconditionError("Backward needs a Forward as the last pass");
  }
  if (lora_ == nullptr) return absl::FailedPreconditionError("no adapter to train");
  if (precision_ != Precision::kF32) {
    return absl::FailedPreconditionError("training runs in fp32; this engine serves bf16");
  }
  TANDEM_RETURN_IF_ERROR(gpu::UseDevice(device_));
  const ParameterSet& host = lora_->parameters();
  if (host.Find(host.names().front())->grad.empty()) {
    return absl::FailedPreconditionError("the adapter's gradients are not enabled");
  }
  if (adapter_grads_ == nullptr) {
    absl::StatusOr<DeviceParameters> grads = DeviceParameters::Upload(host);
    if (!grads.ok()) return grads.status();
    adapter_grads_ = std::make_unique<DeviceParameters>(*std::move(grads));
    device_lora_.clear();  // Cached before there were gradients to point at.
  }
  TANDEM_RETURN_IF_ERROR(adapter_grads_->Zero());
  const int rows = pass_->rows, d = config_.d_model;
  const int64_t n = int64_t{rows} * d;
  TANDEM_ASSIGN_OR_RETURN(dlogits_d, Zeros(int64_t{rows} * config_.vocab_size));
  TANDEM_RETURN_IF_ERROR(gpu::CopyToDevice(dlogits_d.data(), dlogits,
                                           int64_t{rows} * config_.vocab_size * sizeof(float)));
  TANDEM_ASSIGN_OR_RETURN(dnorm, Zeros(n));
  if (dhidden != nullptr) {
    TANDEM_RETURN_IF_ERROR(gpu::CopyToDevice(dnorm.data(), dhidden, n * sizeof(float)));
  }
  TANDEM_RETURN_IF_ERROR(LinearBackward(dlogits_d.data(), HeadWeightName(config_), rows, d,
                                        config_.vocab_size, dnorm.data()));
  TANDEM_ASSIGN_OR_RETURN(dx, Zeros(n));
  TANDEM_RETURN_IF_ERROR(gpu::RmsNormBackward(pass_->final_input.data(),
                                              Weight("model.norm.weight"), pass_->final_rstd.data(),
                                              dnorm.data(), dx.data(), nullptr, rows, d));
  for (int layer = config_.num_layers - 1; layer >= 0; --layer) {
    TANDEM_RETURN_IF_ERROR(BackwardLayer(layer, dx.data()));
  }
  return AddGradientsToHost();
}

// On entry dx holds d(loss)/d(layer output); on exit d(loss)/d(layer input).
absl::Status CudaTransformer::BackwardLayer(int layer, float* dx) {
  Activations& act = pass_->layers[layer];
  const int rows = pass_->rows, d = config_.d_model;
  const int64_t n = int64_t{rows} * d;
  const std::string prefix = absl::StrCat("model.layers.", layer, ".");
  // FFN and its norm; the residual passes dx straight to the FFN block's input.
  TANDEM_ASSIGN_OR_RETURN(dnorm2, Zeros(n));
  if (moe_index_[layer] >= 0) {
    TANDEM_RETURN_IF_ERROR(BackwardMoeFfn(layer, act, dx, dnorm2.data()));
  } else {
    TANDEM_RETURN_IF_ERROR(BackwardSwiGluMlp(layer, act.norm2.data(), pass_->dense_offsets.data(),
                                             1, rows, 0, config_.dense_ffn_dim, act, dx,
                                             dnorm2.data()));
  }
  TANDEM_ASSIGN_OR_RETURN(dmid, Zeros(n));
  TANDEM_RETURN_IF_ERROR(gpu::CopyOnDevice(dmid.data(), dx, n * sizeof(float)));
  TANDEM_RETURN_IF_ERROR(
      gpu::RmsNormBackward(act.mid.data(), Weight(prefix + "post_attention_layernorm.weight"),
                           act.rstd2.data(), dnorm2.data(), dmid.data(), nullptr, rows, d));
  TANDEM_ASSIGN_OR_RETURN(dnorm1, Zeros(n));
  TANDEM_RETURN_IF_ERROR(BackwardAttention(layer, act, dmid.data(), dnorm1.data()));
  TANDEM_RETURN_IF_ERROR(gpu::CopyOnDevice(dx, dmid.data(), n * sizeof(float)));  // Residual.
  return gpu::RmsNormBackward(act.input.data(), Weight(prefix + "input_layernorm.weight"),
                              act.rstd1.data(), dnorm1.data(), dx, nullptr, rows, d);
}

absl::Status CudaTransformer::BackwardAttention(int layer, Activations& act, const float* dmid,
                                                float* dnorm1) {
  const int rows = pass_->rows, d = config_.d_model;
  const int* one_group = pass_->dense_offsets.data();
  const cpu::AttentionShape shape = config_.attention_shape();
  const int64_t q_width = config_.query_width(), k_width = config_.key_width();
  const int64_t v_width = config_.value_width(), out_width = config_.attention_out_dim();
  TANDEM_ASSIGN_OR_RETURN(dattention, Zeros(rows * out_width));
  TANDEM_RETURN_IF_ERROR(ProjectBackward(layer, "o_proj", act.attention.data(), one_group, 1, rows,
                                         0, out_width, d, act.lora_o.data(), dmid,
                                         dattention.data()));
  TANDEM_ASSIGN_OR_RETURN(dq, Zeros(rows * q_width));
  TANDEM_ASSIGN_OR_RETURN(dk, Zeros(rows * k_width));
  TANDEM_ASSIGN_OR_RETURN(dv, Zeros(rows * v_width));
  const std::vector<int>& starts = pass_->sequence_starts;
  int longest = 0;
  for (size_t s = 0; s + 1 < starts.size(); ++s)
    longest = std::max(longest, starts[s + 1] - starts[s]);
  TANDEM_ASSIGN_OR_RETURN(workspace, Zeros(gpu::AttentionBackwardWorkspaceFloats(longest, shape)));
  int64_t probs_offset = 0;
  for (size_t s = 0; s + 1 < starts.size(); ++s) {
    const int64_t begin = starts[s];
    const int length = starts[s + 1] - starts[s];
    TANDEM_RETURN_IF_ERROR(gpu::CausalAttentionBackward(
        act.q.data() + begin * q_width, act.k.data() + begin * k_width,
        act.v.data() + begin * v_width, act.probs.data() + probs_offset,
        dattention.data() + begin * out_width, dq.data() + begin * q_width,
        dk.data() + begin * k_width, dv.data() + begin * v_width, length, shape, workspace.data()));
    probs_offset += int64_t{shape.heads} * length * length;
  }
  const int* positions = pass_->positions.data();
  TANDEM_RETURN_IF_ERROR(gpu::RopeBackward(dq.data(), positions, rows, config_.num_heads, rope_));
  TANDEM_RETURN_IF_ERROR(gpu::RopeBackward(dk.data(), positions, rows, config_.kv_heads(), rope_));
  if (config_.qk_norm != QkNorm::kNone) {
    const std::string prefix = absl::StrCat("model.layers.", layer, ".self_attn.");
    const bool per_head = config_.qk_norm == QkNorm::kPerHead;
    const int head_dim = config_.head_dim();
    // The gradients of the normalized projections become those of the raw ones.
    TANDEM_ASSIGN_OR_RETURN(dq_raw, Zeros(rows * q_width));
    TANDEM_ASSIGN_OR_RETURN(dk_raw, Zeros(rows * k_width));
    TANDEM_RETURN_IF_ERROR(gpu::RmsNormBackward(
        act.q_raw.data(), Weight(prefix + "q_norm.weight"), act.q_rstd.data(), dq.data(),
        dq_raw.data(), nullptr, per_head ? rows * config_.num_heads : rows,
        per_head ? head_dim : config_.num_heads * head_dim));
    TANDEM_RETURN_IF_ERROR(gpu::RmsNormBackward(
        act.k_raw.data(), Weight(prefix + "k_norm.weight"), act.k_rstd.data(), dk.data(),
        dk_raw.data(), nullptr, per_head ? rows * config_.kv_heads() : rows,
        per_head ? head_dim : config_.kv_heads() * head_dim));
    dq = std::move(dq_raw);
    dk = std::move(dk_raw);
  }
  TANDEM_RETURN_IF_ERROR(ProjectBackward(layer, "q_proj", act.norm1.data(), one_group, 1, rows, 0,
                                         d, q_width, act.lora_q.data(), dq.data(), dnorm1));
  TANDEM_RETURN_IF_ERROR(ProjectBackward(layer, "k_proj", act.norm1.data(), one_group, 1, rows, 0,
                                         d, k_width, act.lora_k.data(), dk.data(), dnorm1));
  return ProjectBackward(layer, "v_proj", act.norm1.data(), one_group, 1, rows, 0, d, v_width,
                         act.lora_v.data(), dv.data(), dnorm1);
}

absl::Status CudaTransformer::BackwardMoeFfn(int layer, Activations& act, const float* dy,
                                             float* dnorm2) {
  const int rows = pass_->rows, d = config_.d_model;
  const int experts = config_.num_experts, k = config_.top_k, ffn = config_.expert_ffn_dim;
  const int routed = rows * k;
  const std::string prefix = absl::StrCat("model.layers.", layer, ".mlp.");
  const gpu::DevicePermutation& permutation = *act.permutation;
  TANDEM_ASSIGN_OR_RETURN(drows, Zeros(int64_t{routed} * d));
  TANDEM_ASSIGN_OR_RETURN(dgate_weights, Zeros(routed));
  TANDEM_RETURN_IF_ERROR(gpu::UnpermuteAddBackward(act.ffn_rows_out.data(), permutation,
                                                   act.gate_weights.data(), dy, drows.data(),
                                                   dgate_weights.data(), d));
  TANDEM_ASSIGN_OR_RETURN(dinput, Zeros(int64_t{routed} * d));
  TANDEM_RETURN_IF_ERROR(BackwardSwiGluMlp(layer, act.ffn_in.data(), permutation.offsets.data(),
                                           experts, routed, int64_t{ffn} * d, ffn, act,
                                           drows.data(), dinput.data()));
  TANDEM_RETURN_IF_ERROR(gpu::PermuteRowsBackward(dinput.data(), permutation, dnorm2, d));
  // The router learns through the gate weights, which R3 recomputes from its logits.
  TANDEM_RETURN_IF_ERROR(
      gpu::ScaleInPlace(dgate_weights.data(), config_.routed_scaling_factor, routed));
  TANDEM_ASSIGN_OR_RETURN(drouter_logits, Zeros(int64_t{rows} * experts));
  TANDEM_RETURN_IF_ERROR(gpu::RouterGatesBackward(
      act.router_logits.data(), act.scores.data(), act.ids.data(), dgate_weights.data(),
      drouter_logits.data(), rows, experts, k, config_.norm_topk_prob, config_.scoring));
  TANDEM_RETURN_IF_ERROR(
      LinearBackward(drouter_logits.data(), prefix + "gate.weight", rows, d, experts, dnorm2));
  if (config_.num_shared_experts == 0) return absl::OkStatus();
  const int shared_ffn = config_.shared_expert_ffn_dim();
  const int64_t shared_hidden = int64_t{rows} * shared_ffn;
  TANDEM_ASSIGN_OR_RETURN(dshared_activation, Zeros(shared_hidden));
  TANDEM_ASSIGN_OR_RETURN(dshared_gate, Zeros(shared_hidden));
  TANDEM_ASSIGN_OR_RETURN(dshared_up, Zeros(shared_hidden));
  TANDEM_RETURN_IF_ERROR(LinearBackward(dy, prefix + "shared_experts.down_proj.weight", rows,
                                        shared_ffn, d, dshared_activation.data()));
  TANDEM_RETURN_IF_ERROR(gpu::SwiGluBackward(act.shared_gate.data(), act.shared_up.data(),
                                             dshared_activation.data(), dshared_gate.data(),
                                             dshared_up.data(), shared_hidden));
  TANDEM_RETURN_IF_ERROR(LinearBackward(dshared_gate.data(),
                                        prefix + "shared_experts.gate_proj.weight", rows, d,
                                        shared_ffn, dnorm2));
  return LinearBackward(dshared_up.data(), prefix + "shared_experts.up_proj.weight", rows, d,
                        shared_ffn, dnorm2);
}

absl::Status CudaTransformer::BackwardSwiGluMlp(int layer, const float* x, const int* offsets,
                                                int groups, int rows, int64_t weight_stride,
                                                int ffn, Activations& act, const float* dy,
                                                float* dx) {
  const int d = config_.d_model;
  const int64_t hidden = int64_t{rows} * ffn;
  TANDEM_ASSIGN_OR_RETURN(dactivation, Zeros(hidden));
  TANDEM_ASSIGN_OR_RETURN(dgate, Zeros(hidden));
  TANDEM_ASSIGN_OR_RETURN(dup, Zeros(hidden));
  TANDEM_RETURN_IF_ERROR(ProjectBackward(layer, "down_proj", act.activation.data(), offsets, groups,
                                         rows, weight_stride, ffn, d, act.lora_down.data(), dy,
                                         dactivation.data()));
  TANDEM_RETURN_IF_ERROR(gpu::SwiGluBackward(act.gate.data(), act.up.data(), dactivation.data(),
                                             dgate.data(), dup.data(), hidden));
  TANDEM_RETURN_IF_ERROR(ProjectBackward(layer, "gate_proj", x, offsets, groups, rows,
                                         weight_stride, d, ffn, act.lora_gate.data(), dgate.data(),
                                         dx));
  return ProjectBackward(layer, "up_proj", x, offsets, groups, rows, weight_stride, d, ffn,
                         act.lora_up.data(), dup.data(), dx);
}

absl::Status CudaTransformer::ProjectBackward(int layer, const char* module, const float* x,
                                              const int* offsets, int groups, int rows,
                                              int64_t w_stride, int in, int out,
                                              const float* lora_h, const float* dy, float* dx) {
  TANDEM_RETURN_IF_ERROR(MultiplyGroupsBackward(dy, Weight(ProjectionName(config_, layer, module)),
                                                w_stride, offsets, groups, rows, in, out, dx));
  const std::optional<LoraProjection> lora = DeviceLora(layer, module);
  if (!lora.has_value()) return absl::OkStatus();
  TANDEM_ASSIGN_OR_RETURN(dh, Zeros(int64_t{rows} * lora->weights.rank));
  return gpu::GroupedLoraBackward(x, offsets, groups, rows, in, out, lora->weights, lora_h, dy, dx,
                                  lora->a_grad, lora->b_grad, dh.data());
}

absl::Status CudaTransformer::LinearBackward(const float* dy, const std::string& weight, int rows,
                                             int in, int out, float* dx) {
  return MultiplyGroupsBackward(dy, Weight(weight), 0, pass_->dense_offsets.data(), 1, rows, in,
                                out, dx);
}

// One download per tensor; the host gradients accumulate as the CPU Transformer's do.
absl::Status CudaTransformer::AddGradientsToHost() {
  ParameterSet& host = lora_->parameters();
  std::vector<float> downloaded;
  for (const std::string& name : host.names()) {
    Parameter& parameter = *host.Find(name);
    downloaded.resize(parameter.grad.size());
    TANDEM_RETURN_IF_ERROR(gpu::CopyToHost(downloaded.data(), adapter_grads_->Find(name),
                                           downloaded.size() * sizeof(float)));
    for (size_t i = 0; i < downloaded.size(); ++i) parameter.grad[i] += downloaded[i];
  }
  return absl::OkStatus();
}

}  // namespace tandem::engine::cuda
