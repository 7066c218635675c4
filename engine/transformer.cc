#include "engine/transformer.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/cpu_model_ops.h"
#include "engine/transformer_activations.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/router.h"

namespace tandem::engine {

namespace {

// Attention within each packed sequence, saving probabilities for the backward.
class SequenceAttention : public AttentionBackend {
 public:
  SequenceAttention(ModelOps& ops, const std::vector<int>& starts, const ModelConfig& config,
                    std::vector<std::vector<float>>& probs)
      : ops_(ops),
        starts_(starts),
        shape_(config.attention_shape()),
        q_width_(config.query_width()),
        k_width_(config.key_width()),
        v_width_(config.value_width()),
        probs_(probs) {}

  void Attend(int layer, const float* q, const float* k, const float* v, float* out) override {
    std::vector<float>& probs = probs_[layer];
    int64_t probs_size = 0;
    for (size_t s = 0; s + 1 < starts_.size(); ++s) {
      const int64_t length = starts_[s + 1] - starts_[s];
      probs_size += shape_.heads * length * length;
    }
    probs.resize(probs_size);
    int64_t probs_offset = 0;
    const int64_t out_width = int64_t{shape_.heads} * shape_.v_dim;
    for (size_t s = 0; s + 1 < starts_.size(); ++s) {
      const int64_t begin = starts_[s];
      const int length = starts_[s + 1] - starts_[s];
      ops_.CausalAttention(q + begin * q_width_, k + begin * k_width_, v + begin * v_width_,
                           out + begin * out_width, probs.data() + probs_offset, length, shape_);
      probs_offset += static_cast<int64_t>(shape_.heads) * length * length;
    }
  }

 private:
  ModelOps& ops_;
  const std::vector<int>& starts_;
  const cpu::AttentionShape shape_;
  const int64_t q_width_, k_width_, v_width_;
  std::vector<std::vector<float>>& probs_;
};

// Rows and width the q/k norm of a projection with `heads` heads normalizes over.
std::pair<int, int> QkNormShape(const ModelConfig& config, int rows, int heads) {
  if (config.qk_norm == QkNorm::kPerHead) return {rows * heads, config.head_dim()};
  return {rows, heads * config.head_dim()};
}

}  // namespace

bool SameExpertSet(const int16_t* a, const int16_t* b, int k) {
  for (int i = 0; i < k; ++i) {
    if (std::find(b, b + k, a[i]) == b + k) return false;
  }
  return true;
}

void TokenBatch::Add(const std::vector<int>& sequence) {
  tokens.insert(tokens.end(), sequence.begin(), sequence.end());
  sequence_starts.push_back(static_cast<int>(tokens.size()));
}

double RoutingStats::decision_disagreement() const {
  return decisions == 0 ? 0.0 : static_cast<double>(differing_decisions) / decisions;
}

double RoutingStats::token_disagreement() const {
  return tokens == 0 ? 0.0 : static_cast<double>(differing_tokens) / tokens;
}

Transformer::Transformer(BaseModel& model, LoraAdapter* lora, Precision precision,
                         ExpertExchange* exchange)
    : config_(model.config()),
      model_(model),
      lora_(lora),
      precision_(precision),
      all_experts_local_(exchange == nullptr
                             ? std::make_unique<AllExpertsLocal>(model.config().num_experts)
                             : nullptr),
      exchange_(exchange == nullptr ? all_experts_local_.get() : exchange),
      moe_layers_(config_.MoeLayerIndices()),
      moe_index_(config_.num_layers, -1),
      ops_(std::make_unique<CpuModelOps>(config_)),
      layers_(config_.num_layers),
      attention_probs_(config_.num_layers) {
  for (size_t m = 0; m < moe_layers_.size(); ++m) moe_index_[moe_layers_[m]] = static_cast<int>(m);
}

Transformer::~Transformer() = default;

Parameter& Transformer::Weight(const std::string& name) { return *model_.parameters().Find(name); }

std::optional<LoraProjection> Transformer::Lora(int layer, absl::string_view module,
                                                int first_group) {
  if (lora_ == nullptr) return std::nullopt;
  std::optional<LoraProjection> lora = lora_->Projection(layer, module);
  if (!lora.has_value() || first_group == 0) return lora;
  const int64_t a_offset = first_group * lora->weights.a_group_stride;
  const int64_t b_offset = first_group * lora->weights.b_group_stride;
  lora->weights.a += a_offset;
  lora->weights.b += b_offset;
  if (lora->a_grad != nullptr) lora->a_grad += a_offset;
  if (lora->b_grad != nullptr) lora->b_grad += b_offset;
  return lora;
}

void Transformer::QuantizeInput(float* values, int64_t rows, int64_t width) const {
  if (precision_ == Precision::kFP8) ops_->QuantizeRowsToE4M3(values, rows, width);
}

void Transformer::Round(float* values, int64_t count) const {
  if (precision_ != Precision::kF32) ops_->RoundToBf16(values, count);
}

namespace {

absl::Status CheckReplay(const ModelConfig& config, const std::vector<int16_t>& replay, int rows) {
  const std::vector<int> moe_layers = config.MoeLayerIndices();
  const int k = config.top_k;
  const int layers = static_cast<int>(moe_layers.size());
  const size_t expected = static_cast<size_t>(rows) * layers * k;
  if (replay.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat("replayed routes have ", replay.size(),
                                                   " ids; expected tokens × MoE layers × top_k = ",
                                                   rows, " × ", layers, " × ", k, " = ", expected));
  }
  std::vector<int16_t> layer_rows(static_cast<size_t>(rows) * k);
  for (int m = 0; m < layers; ++m) {
    for (int t = 0; t < rows; ++t) {
      std::copy_n(replay.data() + (int64_t{t} * layers + m) * k, k,
                  layer_rows.data() + int64_t{t} * k);
    }
    const std::string error = cpu::ValidateRoutes(layer_rows.data(), rows, k, config.num_experts);
    if (!error.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("replayed routes of layer ", moe_layers[m], ": ", error));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckForwardInput(const ModelConfig& config, const TokenBatch& batch,
                               const std::vector<int16_t>* replay) {
  for (int s = 0; s < batch.num_sequences(); ++s) {
    const int length = batch.sequence_starts[s + 1] - batch.sequence_starts[s];
    if (length < 1 || length > config.max_seq_len) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, " has ", length,
                                                     " tokens; allowed 1..", config.max_seq_len));
    }
  }
  for (int t = 0; t < batch.num_tokens(); ++t) {
    if (batch.tokens[t] < 0 || batch.tokens[t] >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token ", t, " is ", batch.tokens[t],
                                                     ", outside [0, ", config.vocab_size, ")"));
    }
  }
  if (replay == nullptr) return absl::OkStatus();
  return CheckReplay(config, *replay, batch.num_tokens());
}

absl::StatusOr<const float*> Transformer::Forward(const TokenBatch& batch,
                                                  const std::vector<int16_t>* replay) {
  if (absl::Status status = CheckForwardInput(config_, batch, replay); !status.ok()) {
    return status;
  }
  const int rows = batch.num_tokens();
  tokens_ = batch.tokens;
  sequence_starts_ = batch.sequence_starts;
  positions_.resize(rows);
  for (int s = 0; s < batch.num_sequences(); ++s) {
    for (int t = batch.sequence_starts[s]; t < batch.sequence_starts[s + 1]; ++t) {
      positions_[t] = t - batch.sequence_starts[s];
    }
  }
  SequenceAttention attention(*ops_, sequence_starts_, config_, attention_probs_);
  stats_ = RoutingStats{};
  token_replayed_.assign(rows, 0);
  token_differs_.assign(rows, 0);
  routes_.assign(static_cast<size_t>(rows) * moe_layers_.size() * config_.top_k, -1);
  live_routes_.assign(routes_.size(), -1);

  const int d = config_.d_model;
  const float* embedding = Weight("model.embed_tokens.weight").value.data();
  std::vector<float> x(static_cast<size_t>(rows) * d);
  ops_->EmbeddingGather(embedding, tokens_.data(), x.data(), rows, d);
  Round(x.data(), x.size());
  for (int layer = 0; layer < config_.num_layers; ++layer) {
    layers_[layer].input = x;
    if (absl::Status status =
            RunLayer(layer, positions_.data(), rows, attention,
                     replay == nullptr ? nullptr : replay->data(), layers_[layer]);
        !status.ok()) {
      return status;
    }
    x = layers_[layer].ffn_out;  // RunLayer leaves the layer output here.
  }
  final_input_ = std::move(x);
  RunHead(rows, final_input_.data());
  for (int t = 0; t < rows; ++t) {
    stats_.tokens += token_replayed_[t];
    stats_.differing_tokens += token_differs_[t];
  }
  return logits_.data();
}

absl::Status Transformer::ForwardRows(const int* tokens, const int* positions, int rows,
                                      AttentionBackend& attention, float* logits,
                                      int16_t* routes_out) {
  const int d = config_.d_model;
  const float* embedding = Weight("model.embed_tokens.weight").value.data();
  routes_.assign(static_cast<size_t>(rows) * moe_layers_.size() * config_.top_k, -1);
  live_routes_.assign(routes_.size(), -1);
  stats_ = RoutingStats{};
  std::vector<float> x(static_cast<size_t>(rows) * d);
  ops_->EmbeddingGather(embedding, tokens, x.data(), rows, d);
  Round(x.data(), x.size());
  for (int layer = 0; layer < config_.num_layers; ++layer) {
    layers_[layer].input = std::move(x);
    if (absl::Status status = RunLayer(layer, positions, rows, attention, nullptr, layers_[layer]);
        !status.ok()) {
      return status;
    }
    x = std::move(layers_[layer].ffn_out);
  }
  final_input_ = std::move(x);
  RunHead(rows, final_input_.data());
  std::copy(logits_.begin(), logits_.end(), logits);
  if (routes_out != nullptr) std::copy(routes_.begin(), routes_.end(), routes_out);
  return absl::OkStatus();
}

void Transformer::RunHead(int rows, const float* x) {
  const int d = config_.d_model;
  final_norm_.resize(static_cast<size_t>(rows) * d);
  final_rstd_.resize(rows);
  ops_->RmsNorm(x, Weight("model.norm.weight").value.data(), final_norm_.data(), final_rstd_.data(),
                rows, d, config_.norm_eps);
  Round(final_norm_.data(), final_norm_.size());
  logits_.resize(static_cast<size_t>(rows) * config_.vocab_size);
  ops_->Linear(final_norm_.data(), Weight(HeadWeightName(config_)).value.data(), logits_.data(),
               rows, d, config_.vocab_size, /*accumulate=*/false);
  Round(logits_.data(), logits_.size());
}

absl::Status Transformer::RunLayer(int layer, const int* positions, int rows,
                                   AttentionBackend& attention, const int16_t* replay,
                                   LayerActivations& act) {
  const int d = config_.d_model;
  const int64_t n = static_cast<int64_t>(rows) * d;
  const std::string prefix = absl::StrCat("model.layers.", layer, ".");
  act.norm1.resize(n);
  act.rstd1.resize(rows);
  ops_->RmsNorm(act.input.data(), Weight(prefix + "input_layernorm.weight").value.data(),
                act.norm1.data(), act.rstd1.data(), rows, d, config_.norm_eps);
  Round(act.norm1.data(), n);
  QuantizeInput(act.norm1.data(), rows, d);

  if (config_.latent_attention()) {
    RunLatentProjections(layer, positions, rows, act);
  } else {
    RunStandardProjections(layer, positions, rows, act);
  }
  const int64_t attention_size = int64_t{rows} * config_.attention_out_dim();
  act.attention.resize(attention_size);
  attention.Attend(layer, act.q.data(), act.k.data(), act.v.data(), act.attention.data());
  Round(act.attention.data(), attention_size);
  QuantizeInput(act.attention.data(), rows, config_.attention_out_dim());

  act.norm2_input = act.input;  // Residual: input + o_proj(attention).
  std::vector<float> projected(n);
  const std::vector<int> one_group = {0, rows};
  ops_->ProjectGroups(act.attention.data(), one_group,
                      Weight(ProjectionName(config_, layer, "o_proj")).value.data(), 0,
                      config_.attention_out_dim(), d, Lora(layer, "o_proj"), act.lora_o,
                      projected.data());
  Round(projected.data(), n);
  ops_->Add(act.norm2_input.data(), projected.data(), n);
  Round(act.norm2_input.data(), n);

  act.norm2.resize(n);
  act.rstd2.resize(rows);
  ops_->RmsNorm(act.norm2_input.data(),
                Weight(prefix + "post_attention_layernorm.weight").value.data(), act.norm2.data(),
                act.rstd2.data(), rows, d, config_.norm_eps);
  Round(act.norm2.data(), n);

  if (moe_index_[layer] >= 0) {
    if (absl::Status status = RunMoeFfn(layer, moe_index_[layer], rows, replay, act);
        !status.ok()) {
      return status;
    }
  } else {
    RunDenseFfn(layer, rows, act);
  }
  // ffn_out becomes the layer output: residual + FFN.
  ops_->Add(act.ffn_out.data(), act.norm2_input.data(), n);
  Round(act.ffn_out.data(), n);
  return absl::OkStatus();
}

void Transformer::RunStandardProjections(int layer, const int* positions, int rows,
                                         LayerActivations& act) {
  const int d = config_.d_model;
  const std::string prefix = absl::StrCat("model.layers.", layer, ".");
  const std::vector<int> one_group = {0, rows};
  std::vector<float>* outputs[] = {&act.q, &act.k, &act.v};
  std::vector<float>* lora_h[] = {&act.lora_q, &act.lora_k, &act.lora_v};
  const char* modules[] = {"q_proj", "k_proj", "v_proj"};
  const int widths[] = {config_.q_dim(), config_.kv_dim(), config_.kv_dim()};
  for (int i = 0; i < 3; ++i) {
    const int64_t size = int64_t{rows} * widths[i];
    outputs[i]->resize(size);
    ops_->ProjectGroups(act.norm1.data(), one_group,
                        Weight(ProjectionName(config_, layer, modules[i])).value.data(), 0, d,
                        widths[i], Lora(layer, modules[i]), *lora_h[i], outputs[i]->data());
    Round(outputs[i]->data(), size);
  }
  if (config_.qk_norm != QkNorm::kNone) {
    NormalizeQk(prefix + "self_attn.q_norm.weight", rows, config_.num_heads, act.q, act.q_raw,
                act.q_rstd);
    NormalizeQk(prefix + "self_attn.k_norm.weight", rows, config_.kv_heads(), act.k, act.k_raw,
                act.k_rstd);
  }
  ops_->Rope(act.q.data(), positions, rows, config_.num_heads);
  ops_->Rope(act.k.data(), positions, rows, config_.kv_heads());
}

void Transformer::BackwardStandardProjections(int layer, LayerActivations& act,
                                              std::vector<float>& dq, std::vector<float>& dk,
                                              const std::vector<float>& dv, float* dnorm1) {
  const int rows = static_cast<int>(tokens_.size());
  const int d = config_.d_model;
  const std::string prefix = absl::StrCat("model.layers.", layer, ".");
  ops_->RopeBackward(dq.data(), positions_.data(), rows, config_.num_heads);
  ops_->RopeBackward(dk.data(), positions_.data(), rows, config_.kv_heads());
  if (config_.qk_norm != QkNorm::kNone) {
    NormalizeQkBackward(prefix + "self_attn.q_norm.weight", config_.num_heads, act.q_raw,
                        act.q_rstd, dq);
    NormalizeQkBackward(prefix + "self_attn.k_norm.weight", config_.kv_heads(), act.k_raw,
                        act.k_rstd, dk);
  }
  const std::vector<int> one_group = {0, rows};
  const std::vector<float>* lora_h[] = {&act.lora_q, &act.lora_k, &act.lora_v};
  const float* grads[] = {dq.data(), dk.data(), dv.data()};
  const char* modules[] = {"q_proj", "k_proj", "v_proj"};
  const int widths[] = {config_.q_dim(), config_.kv_dim(), config_.kv_dim()};
  for (int i = 0; i < 3; ++i) {
    Parameter& w = Weight(ProjectionName(config_, layer, modules[i]));
    ops_->ProjectGroupsBackward(act.norm1.data(), one_group, w.value.data(), w.grad_or_null(), 0, d,
                                widths[i], Lora(layer, modules[i]), *lora_h[i], grads[i], dnorm1);
  }
}

void Transformer::NormalizeQk(const std::string& weight, int rows, int heads, std::vector<float>& x,
                              std::vector<float>& raw, std::vector<float>& rstd) {
  raw = x;
  const auto [norm_rows, width] = QkNormShape(config_, rows, heads);
  rstd.resize(norm_rows);
  ops_->RmsNorm(raw.data(), Weight(weight).value.data(), x.data(), rstd.data(), norm_rows, width,
                config_.norm_eps);
  Round(x.data(), x.size());
}

void Transformer::NormalizeQkBackward(const std::string& weight, int heads,
                                      const std::vector<float>& raw, const std::vector<float>& rstd,
                                      std::vector<float>& dx) {
  const int rows = static_cast<int>(tokens_.size());
  const auto [norm_rows, width] = QkNormShape(config_, rows, heads);
  std::vector<float> draw(dx.size(), 0.0f);
  Parameter& norm = Weight(weight);
  ops_->RmsNormBackward(raw.data(), norm.value.data(), rstd.data(), dx.data(), draw.data(),
                        norm.grad_or_null(), norm_rows, width);
  dx = std::move(draw);
}

void Transformer::RunDenseFfn(int layer, int rows, LayerActivations& act) {
  act.group_offsets = {0, rows};
  QuantizeInput(act.norm2.data(), rows, config_.d_model);
  RunSwiGluMlp(layer, act.norm2.data(), 0, config_.dense_ffn_dim, 0, act, act.ffn_out);
}

void Transformer::RunSwiGluMlp(int layer, const float* x, int64_t weight_stride, int ffn,
                               int first_group, LayerActivations& act, std::vector<float>& out) {
  const int d = config_.d_model;
  const int rows = act.group_offsets.back();
  const int64_t hidden = static_cast<int64_t>(rows) * ffn;
  act.gate.resize(hidden);
  act.up.resize(hidden);
  act.activation.resize(hidden);
  out.resize(static_cast<size_t>(rows) * d);
  const int64_t first = first_group * weight_stride;
  ops_->ProjectGroups(x, act.group_offsets,
                      Weight(ProjectionName(config_, layer, "gate_proj")).value.data() + first,
                      weight_stride, d, ffn, Lora(layer, "gate_proj", first_group), act.lora_gate,
                      act.gate.data());
  ops_->ProjectGroups(
      x, act.group_offsets, Weight(ProjectionName(config_, layer, "up_proj")).value.data() + first,
      weight_stride, d, ffn, Lora(layer, "up_proj", first_group), act.lora_up, act.up.data());
  Round(act.gate.data(), hidden);
  Round(act.up.data(), hidden);
  ops_->SwiGlu(act.gate.data(), act.up.data(), act.activation.data(), hidden);
  Round(act.activation.data(), hidden);
  QuantizeInput(act.activation.data(), rows, ffn);
  ops_->ProjectGroups(act.activation.data(), act.group_offsets,
                      Weight(ProjectionName(config_, layer, "down_proj")).value.data() + first,
                      weight_stride, ffn, d, Lora(layer, "down_proj", first_group), act.lora_down,
                      out.data());
  Round(out.data(), out.size());
}

absl::Status Transformer::Backward(const float* dlogits, const float* dhidden) {
  const int rows = static_cast<int>(tokens_.size());
  const int d = config_.d_model;
  std::vector<float> dnorm(static_cast<size_t>(rows) * d, 0.0f);
  if (dhidden != nullptr) dnorm.assign(dhidden, dhidden + dnorm.size());
  Parameter& head = Weight(HeadWeightName(config_));
  ops_->LinearBackward(final_norm_.data(), head.value.data(), dlogits, dnorm.data(),
                       head.grad_or_null(), rows, d, config_.vocab_size);
  std::vector<float> dx(static_cast<size_t>(rows) * d, 0.0f);
  Parameter& norm = Weight("model.norm.weight");
  ops_->RmsNormBackward(final_input_.data(), norm.value.data(), final_rstd_.data(), dnorm.data(),
                        dx.data(), norm.grad_or_null(), rows, d);
  for (int layer = config_.num_layers - 1; layer >= 0; --layer) {
    if (absl::Status status = BackwardLayer(layer, dx.data()); !status.ok()) return status;
  }
  Parameter& embedding = Weight("model.embed_tokens.weight");
  if (embedding.grad.empty()) return absl::OkStatus();
  ops_->EmbeddingBackward(dx.data(), tokens_.data(), embedding.grad.data(), rows, d);
  return absl::OkStatus();
}

// On entry dx holds d(loss)/d(layer output); on exit d(loss)/d(layer input).
absl::Status Transformer::BackwardLayer(int layer, float* dx) {
  LayerActivations& act = layers_[layer];
  const int rows = static_cast<int>(tokens_.size());
  const int d = config_.d_model;
  const int64_t n = static_cast<int64_t>(rows) * d;
  const std::string prefix = absl::StrCat("model.layers.", layer, ".");

  // FFN and its norm; the residual passes dx straight to the FFN block's input.
  std::vector<float> dnorm2(n, 0.0f);
  if (moe_index_[layer] >= 0) {
    if (absl::Status status = BackwardMoeFfn(layer, dx, dnorm2.data()); !status.ok()) {
      return status;
    }
  } else {
    BackwardDenseFfn(layer, dx, dnorm2.data());
  }
  std::vector<float> dmid(dx, dx + n);
  Parameter& post_norm = Weight(prefix + "post_attention_layernorm.weight");
  ops_->RmsNormBackward(act.norm2_input.data(), post_norm.value.data(), act.rstd2.data(),
                        dnorm2.data(), dmid.data(), post_norm.grad_or_null(), rows, d);

  // Attention block.
  const std::vector<int> one_group = {0, rows};
  const cpu::AttentionShape shape = config_.attention_shape();
  const int out_width = config_.attention_out_dim();
  const int q_width = config_.query_width();
  const int k_width = config_.key_width();
  const int v_width = config_.value_width();
  std::vector<float> dattention(int64_t{rows} * out_width, 0.0f);
  Parameter& o = Weight(ProjectionName(config_, layer, "o_proj"));
  ops_->ProjectGroupsBackward(act.attention.data(), one_group, o.value.data(), o.grad_or_null(), 0,
                              out_width, d, Lora(layer, "o_proj"), act.lora_o, dmid.data(),
                              dattention.data());
  std::vector<float> dq(int64_t{rows} * q_width, 0.0f), dk(int64_t{rows} * k_width, 0.0f),
      dv(int64_t{rows} * v_width, 0.0f);
  int64_t probs_offset = 0;
  for (size_t s = 0; s + 1 < sequence_starts_.size(); ++s) {
    const int begin = sequence_starts_[s];
    const int length = sequence_starts_[s + 1] - begin;
    ops_->CausalAttentionBackward(
        act.q.data() + int64_t{begin} * q_width, act.k.data() + int64_t{begin} * k_width,
        act.v.data() + int64_t{begin} * v_width, attention_probs_[layer].data() + probs_offset,
        dattention.data() + int64_t{begin} * out_width, dq.data() + int64_t{begin} * q_width,
        dk.data() + int64_t{begin} * k_width, dv.data() + int64_t{begin} * v_width, length, shape);
    probs_offset += int64_t{shape.heads} * length * length;
  }
  std::vector<float> dnorm1(n, 0.0f);
  if (config_.latent_attention()) {
    BackwardLatentProjections(layer, act, dq, dk, dv, dnorm1.data());
  } else {
    BackwardStandardProjections(layer, act, dq, dk, dv, dnorm1.data());
  }
  std::copy(dmid.begin(), dmid.end(), dx);  // Residual around attention.
  Parameter& input_norm = Weight(prefix + "input_layernorm.weight");
  ops_->RmsNormBackward(act.input.data(), input_norm.value.data(), act.rstd1.data(), dnorm1.data(),
                        dx, input_norm.grad_or_null(), rows, d);
  return absl::OkStatus();
}

void Transformer::BackwardDenseFfn(int layer, const float* dy, float* dnorm2) {
  LayerActivations& act = layers_[layer];
  BackwardSwiGluMlp(layer, act.norm2.data(), 0, config_.dense_ffn_dim, 0, act, dy, dnorm2);
}

void Transformer::BackwardSwiGluMlp(int layer, const float* x, int64_t weight_stride, int ffn,
                                    int first_group, LayerActivations& act, const float* dy,
                                    float* dx) {
  const int d = config_.d_model;
  const int64_t hidden = static_cast<int64_t>(act.group_offsets.back()) * ffn;
  const int64_t first = first_group * weight_stride;
  // A projection's weights and gradient (when enabled) from the first group on.
  auto from_first = [&](const char* module) {
    Parameter& weight = Weight(ProjectionName(config_, layer, module));
    float* grad = weight.grad_or_null();
    return std::pair<const float*, float*>(weight.value.data() + first,
                                           grad == nullptr ? nullptr : grad + first);
  };
  std::vector<float> dactivation(hidden, 0.0f), dgate(hidden, 0.0f), dup(hidden, 0.0f);
  const auto [down, down_grad] = from_first("down_proj");
  ops_->ProjectGroupsBackward(act.activation.data(), act.group_offsets, down, down_grad,
                              weight_stride, ffn, d, Lora(layer, "down_proj", first_group),
                              act.lora_down, dy, dactivation.data());
  ops_->SwiGluBackward(act.gate.data(), act.up.data(), dactivation.data(), dgate.data(), dup.data(),
                       hidden);
  const auto [gate, gate_grad] = from_first("gate_proj");
  const auto [up, up_grad] = from_first("up_proj");
  ops_->ProjectGroupsBackward(x, act.group_offsets, gate, gate_grad, weight_stride, d, ffn,
                              Lora(layer, "gate_proj", first_group), act.lora_gate, dgate.data(),
                              dx);
  ops_->ProjectGroupsBackward(x, act.group_offsets, up, up_grad, weight_stride, d, ffn,
                              Lora(layer, "up_proj", first_group), act.lora_up, dup.data(), dx);
}

}  // namespace tandem::engine
