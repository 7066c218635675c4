// The MoE block of Transformer, in stages: route (or replay) -> permute by expert -> dispatch ->
// grouped expert compute with grouped LoRA -> combine -> unpermute and gate, plus the shared
// experts. Dispatch and combine are the ExpertExchange's: nothing on one rank, the all-to-all
// over expert-parallel ranks.

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/transformer.h"
#include "engine/transformer_activations.h"

namespace tandem::engine {
namespace {

std::string MlpPrefix(int layer) { return absl::StrCat("model.layers.", layer, ".mlp."); }

// Where MoE layer `moe_layer`'s stacked tensors of `parameters` hold `experts` one after the
// other: the stacked index of the first, or -1 when they are not all held in that order.
int ConsecutiveIndex(const ParameterSet& parameters, int moe_layer,
                     const std::vector<int>& experts) {
  const int first = parameters.StackedIndex(moe_layer, experts.front());
  for (size_t i = 0; i < experts.size(); ++i) {
    if (first < 0 ||
        parameters.StackedIndex(moe_layer, experts[i]) != first + static_cast<int>(i)) {
      return -1;
    }
  }
  return first;
}

}  // namespace

absl::StatusOr<Transformer::ExpertSlots> Transformer::LocalExpertSlots(int layer) {
  const int moe_layer = moe_index_[layer];
  absl::StatusOr<LocalExperts> computed = exchange_->local_experts(moe_layer);
  if (!computed.ok()) return computed.status();
  const std::vector<int>& local = computed->experts;
  const ExpertSlots slots{
      .base = ConsecutiveIndex(model_.parameters(), moe_layer, local),
      .lora = lora_ == nullptr ? 0 : ConsecutiveIndex(lora_->parameters(), moe_layer, local)};
  if (slots.base < 0 || slots.lora < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("this rank computes experts ", absl::StrJoin(local, ","), " of layer ", layer,
                     ", which its model or adapter does not hold in that order"));
  }
  return slots;
}

absl::Status Transformer::RunMoeFfn(int layer, int moe_index, int rows, const int16_t* replay,
                                    LayerActivations& act) {
  const int d = config_.d_model;
  const int k = config_.top_k;
  // Refused before the first collective, so a misconfigured rank fails at once.
  if (exchange_->needs_host_memory() && !ops_->capabilities().host_memory) {
    return absl::FailedPreconditionError(
        "this expert exchange reads the rows itself, which needs a host-memory backend");
  }
  absl::StatusOr<ExpertSlots> slots = LocalExpertSlots(layer);
  if (!slots.ok()) return slots.status();
  RouteTokens(layer, moe_index, rows, replay, act);

  // Permute: each expert's rows contiguous, quantized before they travel (as vLLM's prepare).
  const Buffer<int16_t>& order =
      exchange_->expert_slots(moe_index) != nullptr ? act.slots : act.ids;
  act.permutation = ops_->BuildPermutation(order.ref(), rows, k, config_.num_experts);
  const int routed = rows * k;
  ops_->Resize(act.expert_input, int64_t{routed} * d);
  ops_->PermuteRows(act.norm2.ref(), act.permutation, act.expert_input.ref(), d);
  QuantizeInput(act.expert_input.ref(), routed, d);

  absl::StatusOr<ExchangePlan> plan = exchange_->Plan(moe_index, act.permutation.offsets);
  if (!plan.ok()) return plan.status();
  act.exchange_plan = *std::move(plan);
  if (absl::Status status = exchange_->Dispatch(act.exchange_plan, d, act.expert_input, *ops_);
      !status.ok()) {
    return status;
  }
  const int ffn = config_.expert_ffn_dim;
  act.group_offsets = act.exchange_plan.local_offsets;
  RunSwiGluMlp(layer, act.expert_input.ref(), int64_t{ffn} * d, ffn, *slots, act,
               act.expert_output);
  if (absl::Status status = exchange_->Combine(act.exchange_plan, d, act.expert_output, *ops_);
      !status.ok()) {
    return status;
  }

  ops_->Resize(act.ffn_out, int64_t{rows} * d);
  ops_->Fill(act.ffn_out.ref(), 0.0f, act.ffn_out.size());
  ops_->UnpermuteAdd(act.expert_output.ref(), act.permutation, act.gate_weights.ref(),
                     act.ffn_out.ref(), d);
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

  ops_->Resize(act.router_logits, int64_t{rows} * experts);
  ops_->Linear(act.norm2.ref(), Weight(prefix + "gate.weight"), act.router_logits.ref(), rows, d,
               experts, /*accumulate=*/false);
  Round(act.router_logits.ref(), act.router_logits.size());
  ops_->Resize(act.scores, act.router_logits.size());
  ops_->RouterScores(act.router_logits.ref(), act.scores.ref(), rows, experts, config_.scoring);
  const std::string bias_name = prefix + "gate.e_score_correction_bias";
  const WeightRef bias =
      model_.parameters().Find(bias_name) == nullptr ? WeightRef() : Weight(bias_name);
  ops_->Resize(act.ids, int64_t{rows} * k);
  ops_->TopK(act.scores.ref(), bias, rows, experts, k, act.ids.ref(),
             {config_.num_expert_groups, config_.kept_expert_groups});

  // Recording and replay work on the host: routes are small (tokens × top_k ids per layer).
  std::vector<int16_t> ids(act.ids.size());
  ops_->CopyOut(act.ids.ref(), ids.data(), ids.size());
  for (int t = 0; t < rows; ++t) {
    std::copy_n(ids.data() + int64_t{t} * k, k,
                live_routes_.data() + (int64_t{t} * layers + moe_index) * k);
  }
  if (replay != nullptr) {  // Replace live routes by the given ones, measuring disagreement.
    for (int t = 0; t < rows; ++t) {
      const int16_t* given = replay + (int64_t{t} * layers + moe_index) * k;
      int16_t* used = ids.data() + int64_t{t} * k;
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
    ops_->CopyIn(ids.data(), act.ids.ref(), ids.size());
  }
  for (int t = 0; t < rows; ++t) {
    std::copy_n(ids.data() + int64_t{t} * k, k,
                routes_.data() + (int64_t{t} * layers + moe_index) * k);
  }
  if (const std::vector<int16_t>* slots = exchange_->expert_slots(moe_index); slots != nullptr) {
    for (int16_t& id : ids) id = (*slots)[id];
    ops_->Upload(ids.data(), static_cast<int64_t>(ids.size()), act.slots);
  }

  // Gates come from this model's scores over the experts used, replayed ones included.
  ops_->Resize(act.gate_weights, int64_t{rows} * k);
  ops_->GateWeights(act.scores.ref(), act.ids.ref(), rows, experts, k, config_.norm_topk_prob,
                    act.gate_weights.ref());
  ops_->Scale(act.gate_weights.ref(), config_.routed_scaling_factor, act.gate_weights.size());
}

void Transformer::RunSharedExperts(int layer, int rows, LayerActivations& act) {
  if (config_.num_shared_experts == 0) return;
  const int d = config_.d_model;
  const std::string prefix = MlpPrefix(layer);
  const int shared_ffn = config_.shared_expert_ffn_dim();
  const int64_t shared_hidden = static_cast<int64_t>(rows) * shared_ffn;
  ops_->Resize(act.shared_gate, shared_hidden);
  ops_->Resize(act.shared_up, shared_hidden);
  ops_->Resize(act.shared_activation, shared_hidden);
  // The router reads norm2 unquantized; the shared experts' FP8 input is a quantized copy.
  Buffer<float> quantized;
  Ref<const float> input = act.norm2.ref();
  if (precision_ == Precision::kFP8) {
    ops_->Resize(quantized, act.norm2.size());
    ops_->Copy(act.norm2.ref(), quantized.ref(), act.norm2.size());
    QuantizeInput(quantized.ref(), rows, d);
    input = quantized.ref();
  }
  ops_->Linear(input, Weight(prefix + "shared_experts.gate_proj.weight"), act.shared_gate.ref(),
               rows, d, shared_ffn, /*accumulate=*/false);
  ops_->Linear(input, Weight(prefix + "shared_experts.up_proj.weight"), act.shared_up.ref(), rows,
               d, shared_ffn, /*accumulate=*/false);
  Round(act.shared_gate.ref(), shared_hidden);
  Round(act.shared_up.ref(), shared_hidden);
  ops_->SwiGlu(act.shared_gate.ref(), act.shared_up.ref(), act.shared_activation.ref(),
               shared_hidden);
  Round(act.shared_activation.ref(), shared_hidden);
  QuantizeInput(act.shared_activation.ref(), rows, shared_ffn);
  ops_->Linear(act.shared_activation.ref(), Weight(prefix + "shared_experts.down_proj.weight"),
               act.ffn_out.ref(), rows, shared_ffn, d, /*accumulate=*/true);
}

absl::Status Transformer::BackwardMoeFfn(int layer, Ref<const float> dy, Ref<float> dnorm2) {
  LayerActivations& act = layers_[layer];
  const int rows = static_cast<int>(tokens_.size());
  const int d = config_.d_model;
  const int k = config_.top_k;
  const int experts = config_.num_experts;
  const int ffn = config_.expert_ffn_dim;
  const int routed = rows * k;
  absl::StatusOr<ExpertSlots> slots = LocalExpertSlots(layer);
  if (!slots.ok()) return slots.status();

  // Unpermute and gate, backward: the rows' gradients and the gates'.
  Buffer<float> drows = ops_->Zeros(int64_t{routed} * d);
  Buffer<float> dgate_weights = ops_->Zeros(routed);
  ops_->UnpermuteAddBackward(act.expert_output.ref(), act.permutation, act.gate_weights.ref(), dy,
                             drows.ref(), dgate_weights.ref(), d);
  // Combine's transpose is Dispatch: the output gradients go to the experts that made them.
  if (absl::Status status = exchange_->Dispatch(act.exchange_plan, d, drows, *ops_); !status.ok()) {
    return status;
  }
  Buffer<float> dinput = ops_->Zeros(act.expert_input.size());
  BackwardSwiGluMlp(layer, act.expert_input.ref(), int64_t{ffn} * d, ffn, *slots, act, drows.ref(),
                    dinput.ref());
  // And Dispatch's is Combine: the input gradients go back to the rows' ranks.
  if (absl::Status status = exchange_->Combine(act.exchange_plan, d, dinput, *ops_); !status.ok()) {
    return status;
  }
  ops_->PermuteRowsBackward(dinput.ref(), act.permutation, dnorm2, d);

  // The router learns through the gate weights, which R3 recomputes from its logits.
  ops_->Scale(dgate_weights.ref(), config_.routed_scaling_factor, dgate_weights.size());
  Buffer<float> drouter_logits = ops_->Zeros(int64_t{rows} * experts);
  ops_->RouterGatesBackward(act.router_logits.ref(), act.scores.ref(), act.ids.ref(),
                            dgate_weights.ref(), drouter_logits.ref(), rows, experts, k,
                            config_.norm_topk_prob, config_.scoring);
  const WeightRef router = Weight(MlpPrefix(layer) + "gate.weight");
  ops_->LinearBackward(act.norm2.ref(), router, drouter_logits.ref(), dnorm2, rows, d, experts);
  BackwardSharedExperts(layer, rows, dy, dnorm2);
  return absl::OkStatus();
}

void Transformer::BackwardSharedExperts(int layer, int rows, Ref<const float> dy,
                                        Ref<float> dnorm2) {
  if (config_.num_shared_experts == 0) return;
  LayerActivations& act = layers_[layer];
  const int d = config_.d_model;
  const std::string prefix = MlpPrefix(layer);
  const int shared_ffn = config_.shared_expert_ffn_dim();
  const int64_t shared_hidden = static_cast<int64_t>(rows) * shared_ffn;
  Buffer<float> dshared_activation = ops_->Zeros(shared_hidden);
  Buffer<float> dshared_gate = ops_->Zeros(shared_hidden);
  Buffer<float> dshared_up = ops_->Zeros(shared_hidden);
  const WeightRef shared_down = Weight(prefix + "shared_experts.down_proj.weight");
  ops_->LinearBackward(act.shared_activation.ref(), shared_down, dy, dshared_activation.ref(), rows,
                       shared_ffn, d);
  ops_->SwiGluBackward(act.shared_gate.ref(), act.shared_up.ref(), dshared_activation.ref(),
                       dshared_gate.ref(), dshared_up.ref(), shared_hidden);
  const WeightRef shared_gate = Weight(prefix + "shared_experts.gate_proj.weight");
  const WeightRef shared_up = Weight(prefix + "shared_experts.up_proj.weight");
  ops_->LinearBackward(act.norm2.ref(), shared_gate, dshared_gate.ref(), dnorm2, rows, d,
                       shared_ffn);
  ops_->LinearBackward(act.norm2.ref(), shared_up, dshared_up.ref(), dnorm2, rows, d, shared_ffn);
}

}  // namespace tandem::engine
