// The MoE block of Transformer, in stages: route (or replay) -> permute by expert -> dispatch ->
// grouped expert compute with grouped LoRA -> combine -> unpermute and gate, plus the shared
// experts. Dispatch and combine are the ExpertExchange's: copies on one rank, the all-to-all
// over expert-parallel ranks.

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/transformer.h"
#include "engine/transformer_activations.h"

namespace tandem::engine {
namespace {

std::string MlpPrefix(int layer) { return absl::StrCat("model.layers.", layer, ".mlp."); }

}  // namespace

absl::Status Transformer::RunMoeFfn(int layer, int moe_index, int rows, const int16_t* replay,
                                    LayerActivations& act) {
  const int d = config_.d_model;
  const int k = config_.top_k;
  RouteTokens(layer, moe_index, rows, replay, act);

  // Permute: each expert's rows contiguous, quantized before they travel (as vLLM's prepare).
  act.permutation = ops_->BuildPermutation(act.ids.data(), rows, k, config_.num_experts);
  const int routed = rows * k;
  act.expert_input.resize(static_cast<size_t>(routed) * d);
  ops_->PermuteRows(act.norm2.data(), act.permutation, act.expert_input.data(), d);
  QuantizeInput(act.expert_input.data(), routed, d);

  absl::StatusOr<ExchangePlan> plan = exchange_->Plan(act.permutation.offsets);
  if (!plan.ok()) return plan.status();
  act.exchange_plan = *std::move(plan);
  if (absl::Status status = exchange_->Dispatch(act.exchange_plan, d, act.expert_input);
      !status.ok()) {
    return status;
  }
  const int ffn = config_.expert_ffn_dim;
  act.group_offsets = act.exchange_plan.local_offsets;
  RunSwiGluMlp(layer, act.expert_input.data(), int64_t{ffn} * d, ffn,
               exchange_->local_experts().first, act, act.expert_output);
  if (absl::Status status = exchange_->Combine(act.exchange_plan, d, act.expert_output);
      !status.ok()) {
    return status;
  }

  act.ffn_out.assign(static_cast<size_t>(rows) * d, 0.0f);
  ops_->UnpermuteAdd(act.expert_output.data(), act.permutation, act.gate_weights.data(),
                     act.ffn_out.data(), d);
  RunSharedExperts(layer, rows, act);
  return absl::OkStatus();
}

void Transformer::RouteTokens(int layer, int moe_index, int rows, const int16_t* replay,
                              LayerActivations& act) {
  const int d = config_.d_model;
  const int experts = config_.num_experts;
  const int k = config_.top_k;
  const int layers = static_cast<int>(moe_layers_.size());
  const std::string prefix = MlpPrefix(layer);

  act.router_logits.resize(static_cast<size_t>(rows) * experts);
  ops_->Linear(act.norm2.data(), Weight(prefix + "gate.weight").value.data(),
               act.router_logits.data(), rows, d, experts, /*accumulate=*/false);
  Round(act.router_logits.data(), act.router_logits.size());
  act.scores.resize(act.router_logits.size());
  ops_->RouterScores(act.router_logits.data(), act.scores.data(), rows, experts, config_.scoring);
  const Parameter* bias = model_.parameters().Find(prefix + "gate.e_score_correction_bias");
  act.ids.resize(static_cast<size_t>(rows) * k);
  ops_->TopK(act.scores.data(), bias == nullptr ? nullptr : bias->value.data(), rows, experts, k,
             act.ids.data(), {config_.num_expert_groups, config_.kept_expert_groups});

  for (int t = 0; t < rows; ++t) {
    std::copy_n(act.ids.data() + int64_t{t} * k, k,
                live_routes_.data() + (int64_t{t} * layers + moe_index) * k);
  }
  if (replay != nullptr) {  // Replace live routes by the given ones, measuring disagreement.
    for (int t = 0; t < rows; ++t) {
      const int16_t* given = replay + (int64_t{t} * layers + moe_index) * k;
      int16_t* used = act.ids.data() + int64_t{t} * k;
      if (given[0] < 0) {
        ++stats_.live_fallbacks;
        continue;
      }
      ++stats_.decisions;
      token_replayed_[t] = 1;
      if (!SameExpertSet(used, given, k)) {
        ++stats_.differing_decisions;
        token_differs_[t] = 1;
      }
      std::copy_n(given, k, used);
    }
  }
  for (int t = 0; t < rows; ++t) {
    std::copy_n(act.ids.data() + int64_t{t} * k, k,
                routes_.data() + (int64_t{t} * layers + moe_index) * k);
  }

  // Gates come from this model's scores over the experts used, replayed ones included.
  act.gate_weights.resize(static_cast<size_t>(rows) * k);
  ops_->GateWeights(act.scores.data(), act.ids.data(), rows, experts, k, config_.norm_topk_prob,
                    act.gate_weights.data());
  ops_->Scale(act.gate_weights.data(), config_.routed_scaling_factor, act.gate_weights.size());
}

void Transformer::RunSharedExperts(int layer, int rows, LayerActivations& act) {
  if (config_.num_shared_experts == 0) return;
  const int d = config_.d_model;
  const std::string prefix = MlpPrefix(layer);
  const int shared_ffn = config_.shared_expert_ffn_dim();
  const int64_t shared_hidden = static_cast<int64_t>(rows) * shared_ffn;
  act.shared_gate.resize(shared_hidden);
  act.shared_up.resize(shared_hidden);
  act.shared_activation.resize(shared_hidden);
  // The router reads norm2 unquantized; the shared experts' FP8 input is a quantized copy.
  std::vector<float> quantized;
  const float* input = act.norm2.data();
  if (precision_ == Precision::kFP8) {
    quantized = act.norm2;
    QuantizeInput(quantized.data(), rows, d);
    input = quantized.data();
  }
  ops_->Linear(input, Weight(prefix + "shared_experts.gate_proj.weight").value.data(),
               act.shared_gate.data(), rows, d, shared_ffn, /*accumulate=*/false);
  ops_->Linear(input, Weight(prefix + "shared_experts.up_proj.weight").value.data(),
               act.shared_up.data(), rows, d, shared_ffn, /*accumulate=*/false);
  Round(act.shared_gate.data(), shared_hidden);
  Round(act.shared_up.data(), shared_hidden);
  ops_->SwiGlu(act.shared_gate.data(), act.shared_up.data(), act.shared_activation.data(),
               shared_hidden);
  Round(act.shared_activation.data(), shared_hidden);
  QuantizeInput(act.shared_activation.data(), rows, shared_ffn);
  ops_->Linear(act.shared_activation.data(),
               Weight(prefix + "shared_experts.down_proj.weight").value.data(), act.ffn_out.data(),
               rows, shared_ffn, d, /*accumulate=*/true);
}

absl::Status Transformer::BackwardMoeFfn(int layer, const float* dy, float* dnorm2) {
  LayerActivations& act = layers_[layer];
  const int rows = static_cast<int>(tokens_.size());
  const int d = config_.d_model;
  const int k = config_.top_k;
  const int experts = config_.num_experts;
  const int ffn = config_.expert_ffn_dim;
  const int routed = rows * k;

  // Unpermute and gate, backward: the rows' gradients and the gates'.
  std::vector<float> drows(static_cast<size_t>(routed) * d, 0.0f);
  std::vector<float> dgate_weights(static_cast<size_t>(routed), 0.0f);
  ops_->UnpermuteAddBackward(act.expert_output.data(), act.permutation, act.gate_weights.data(), dy,
                             drows.data(), dgate_weights.data(), d);
  // Combine's transpose is Dispatch: the output gradients go to the experts that made them.
  if (absl::Status status = exchange_->Dispatch(act.exchange_plan, d, drows); !status.ok()) {
    return status;
  }
  std::vector<float> dinput(act.expert_input.size(), 0.0f);
  BackwardSwiGluMlp(layer, act.expert_input.data(), int64_t{ffn} * d, ffn,
                    exchange_->local_experts().first, act, drows.data(), dinput.data());
  // And Dispatch's is Combine: the input gradients go back to the rows' ranks.
  if (absl::Status status = exchange_->Combine(act.exchange_plan, d, dinput); !status.ok()) {
    return status;
  }
  ops_->PermuteRowsBackward(dinput.data(), act.permutation, dnorm2, d);

  // The router learns through the gate weights, which R3 recomputes from its logits.
  ops_->Scale(dgate_weights.data(), config_.routed_scaling_factor, dgate_weights.size());
  std::vector<float> drouter_logits(static_cast<size_t>(rows) * experts, 0.0f);
  ops_->RouterGatesBackward(act.router_logits.data(), act.scores.data(), act.ids.data(),
                            dgate_weights.data(), drouter_logits.data(), rows, experts, k,
                            config_.norm_topk_prob, config_.scoring);
  Parameter& router = Weight(MlpPrefix(layer) + "gate.weight");
  ops_->LinearBackward(act.norm2.data(), router.value.data(), drouter_logits.data(), dnorm2,
                       router.grad_or_null(), rows, d, experts);
  BackwardSharedExperts(layer, rows, dy, dnorm2);
  return absl::OkStatus();
}

void Transformer::BackwardSharedExperts(int layer, int rows, const float* dy, float* dnorm2) {
  if (config_.num_shared_experts == 0) return;
  LayerActivations& act = layers_[layer];
  const int d = config_.d_model;
  const std::string prefix = MlpPrefix(layer);
  const int shared_ffn = config_.shared_expert_ffn_dim();
  const int64_t shared_hidden = static_cast<int64_t>(rows) * shared_ffn;
  std::vector<float> dshared_activation(shared_hidden, 0.0f), dshared_gate(shared_hidden, 0.0f),
      dshared_up(shared_hidden, 0.0f);
  Parameter& shared_down = Weight(prefix + "shared_experts.down_proj.weight");
  ops_->LinearBackward(act.shared_activation.data(), shared_down.value.data(), dy,
                       dshared_activation.data(), shared_down.grad_or_null(), rows, shared_ffn, d);
  ops_->SwiGluBackward(act.shared_gate.data(), act.shared_up.data(), dshared_activation.data(),
                       dshared_gate.data(), dshared_up.data(), shared_hidden);
  Parameter& shared_gate = Weight(prefix + "shared_experts.gate_proj.weight");
  Parameter& shared_up = Weight(prefix + "shared_experts.up_proj.weight");
  ops_->LinearBackward(act.norm2.data(), shared_gate.value.data(), dshared_gate.data(), dnorm2,
                       shared_gate.grad_or_null(), rows, d, shared_ffn);
  ops_->LinearBackward(act.norm2.data(), shared_up.value.data(), dshared_up.data(), dnorm2,
                       shared_up.grad_or_null(), rows, d, shared_ffn);
}

}  // namespace tandem::engine
