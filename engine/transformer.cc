#include "engine/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/transformer_activations.h"
#include "kernels/routes.h"
#include "kernels/types.h"

namespace tandem::engine {

namespace {

// Attention within each packed sequence, saving probabilities for the backward.
class SequenceAttention : public AttentionBackend {
 public:
  SequenceAttention(ModelOps& ops, const std::vector<int>& starts, const ModelConfig& config,
                    std::vector<Buffer<float>>& probs)
      : ops_(ops),
        starts_(starts),
        shape_(config.attention_shape()),
        q_width_(config.query_width()),
        k_width_(config.key_width()),
        v_width_(config.value_width()),
        probs_(probs) {}

  void Attend(int layer, Ref<const float> q, Ref<const float> k, Ref<const float> v,
              Ref<float> out) override {
    Buffer<float>& probs = probs_[layer];
    int64_t probs_size = 0;
    for (size_t s = 0; s + 1 < starts_.size(); ++s) {
      const int64_t length = starts_[s + 1] - starts_[s];
      probs_size += shape_.heads * length * length;
    }
    ops_.Resize(probs, probs_size);
    int64_t probs_offset = 0;
    const int64_t out_width = int64_t{shape_.heads} * shape_.v_dim;
    for (size_t s = 0; s + 1 < starts_.size(); ++s) {
      const int64_t begin = starts_[s];
      const int length = starts_[s + 1] - starts_[s];
      ops_.CausalAttention(q + begin * q_width_, k + begin * k_width_, v + begin * v_width_,
                           out + begin * out_width, probs.ref() + probs_offset, length, shape_);
      probs_offset += static_cast<int64_t>(shape_.heads) * length * length;
    }
  }

 private:
  ModelOps& ops_;
  const std::vector<int>& starts_;
  const kernels::AttentionShape shape_;
  const int64_t q_width_, k_width_, v_width_;
  std::vector<Buffer<float>>& probs_;
};

// A backend must be given: the graph picks none of its own.
std::unique_ptr<ModelOps> Required(std::unique_ptr<ModelOps> ops) {
  if (ops == nullptr) std::abort();
  return ops;
}

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

Transformer::Transformer(BaseModel& model, LoraAdapter* lora, std::unique_ptr<ModelOps> ops,
                         Precision precision, ExpertExchange* exchange)
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
      ops_(Required(std::move(ops))),
      weights_(*ops_, model, lora),
      layers_(config_.num_layers),
      attention_probs_(config_.num_layers) {
  for (size_t m = 0; m < moe_layers_.size(); ++m) moe_index_[moe_layers_[m]] = static_cast<int>(m);
}

Transformer::~Transformer() = default;

WeightRef Transformer::Weight(const std::string& name) const { return weights_.Get(name); }

std::optional<LoraProjection> Transformer::Lora(int layer, absl::string_view module,
                                                int first_group) const {
  return weights_.Lora(layer, module, first_group);
}

absl::Status Transformer::Finished(absl::Status status) {
  absl::Status finished = ops_->Finish();
  return status.ok() ? finished : status;
}

void Transformer::QuantizeInput(Ref<float> values, int64_t rows, int64_t width) const {
  if (precision_ == Precision::kFP8) ops_->QuantizeRowsToE4M3(values, rows, width);
}

void Transformer::Round(Ref<float> values, int64_t count) const {
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
    const std::string error =
        kernels::ValidateRoutes(layer_rows.data(), rows, k, config.num_experts);
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

absl::Status Transformer::ForwardTrunk(const TokenBatch& batch,
                                       const std::vector<int16_t>* replay) {
  backward_ready_ = Ready::kNone;
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
  ops_->Upload(tokens_.data(), rows, token_buffer_);
  ops_->Upload(positions_.data(), rows, position_buffer_);
  SequenceAttention attention(*ops_, sequence_starts_, config_, attention_probs_);
  stats_ = RoutingStats{};
  token_replayed_.assign(rows, 0);
  token_differs_.assign(rows, 0);
  if (absl::Status status =
          RunLayers(rows, attention, replay == nullptr ? nullptr : replay->data());
      !status.ok()) {
    return Finished(status);
  }
  for (int t = 0; t < rows; ++t) {
    stats_.tokens += token_replayed_[t];
    stats_.differing_tokens += token_differs_[t];
  }
  RunFinalNorm(rows);
  final_hidden_.resize(final_norm_.size());
  ops_->CopyOut(final_norm_.ref(), final_hidden_.data(), final_norm_.size());
  return absl::OkStatus();
}

absl::StatusOr<const float*> Transformer::Forward(const TokenBatch& batch,
                                                  const std::vector<int16_t>* replay) {
  if (absl::Status status = ForwardTrunk(batch, replay); !status.ok()) return status;
  const int rows = batch.num_tokens();
  RunHeadTile(0, rows, 0, config_.vocab_size, 1.0f);
  logits_on_host_.resize(logits_.size());
  ops_->CopyOut(logits_.ref(), logits_on_host_.data(), logits_.size());
  if (absl::Status status = ops_->Finish(); !status.ok()) return status;
  backward_ready_ = Ready::kLogits;
  return logits_on_host_.data();
}

absl::StatusOr<std::vector<float>> Transformer::ForwardLogProbs(const TokenBatch& batch,
                                                                const std::vector<int16_t>* replay,
                                                                const std::vector<int>& targets,
                                                                float temperature) {
  const int rows = batch.num_tokens();
  if (static_cast<int>(targets.size()) != rows) {
    return absl::InvalidArgumentError(
        absl::StrCat(targets.size(), " targets for ", rows, " tokens: want one per token"));
  }
  for (int t = 0; t < rows; ++t) {
    if (targets[t] < -1 || targets[t] >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("target ", t, " is ", targets[t],
                                                     "; want -1 or [0, ", config_.vocab_size, ")"));
    }
  }
  if (!(temperature > 0) || !std::isfinite(temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature ", temperature, "; want positive and finite"));
  }
  if (absl::Status status = ForwardTrunk(batch, replay); !status.ok()) return status;
  targets_ = targets;
  temperature_ = temperature;
  std::vector<int> kernel_targets(targets);
  for (int& target : kernel_targets) target = std::max(target, 0);  // Scored, then ignored.
  ops_->Upload(kernel_targets.data(), rows, target_buffer_);
  ops_->Resize(log_sum_exps_, rows);
  ops_->Fill(log_sum_exps_.ref(), -std::numeric_limits<float>::infinity(), rows);
  Buffer<float> target_logits = ops_->Allocate<float>(rows);
  ForEachHeadTile(rows, [&](int first_row, int tile_rows, int first_column, int columns) {
    RunHeadTile(first_row, tile_rows, first_column, columns, temperature);
    ops_->FoldLogSumExp(logits_.ref(), target_buffer_.ref() + first_row,
                        log_sum_exps_.ref() + first_row, target_logits.ref() + first_row, tile_rows,
                        first_column, columns);
  });
  std::vector<float> on_host(rows), log_sum_exps(rows);
  ops_->CopyOut(target_logits.ref(), on_host.data(), rows);
  ops_->CopyOut(log_sum_exps_.ref(), log_sum_exps.data(), rows);
  if (absl::Status status = ops_->Finish(); !status.ok()) return status;
  for (int t = 0; t < rows; ++t) on_host[t] -= log_sum_exps[t];
  for (int t = 0; t < rows; ++t) {
    if (targets[t] < 0) on_host[t] = 0;
  }
  backward_ready_ = Ready::kLogProbs;
  return on_host;
}

absl::Status Transformer::ForwardRows(const int* tokens, const int* positions, int rows,
                                      AttentionBackend& attention, float* logits,
                                      int16_t* routes_out, absl::Span<const int> logit_rows) {
  for (size_t i = 0; i < logit_rows.size(); ++i) {
    if (logit_rows[i] < 0 || logit_rows[i] >= rows ||
        (i > 0 && logit_rows[i] <= logit_rows[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat("logit rows must ascend within [0, ", rows,
                                                     "); row ", i, " is ", logit_rows[i]));
    }
  }
  backward_ready_ = Ready::kNone;  // The forward's activations and inputs are overwritten.
  ops_->Upload(tokens, rows, token_buffer_);
  ops_->Upload(positions, rows, position_buffer_);
  stats_ = RoutingStats{};
  if (absl::Status status = RunLayers(rows, attention, nullptr); !status.ok()) {
    return Finished(status);
  }
  if (logit_rows.empty()) {
    RunHead(rows);
  } else {
    KeepFinalRows(logit_rows);
    RunHead(static_cast<int>(logit_rows.size()));
  }
  ops_->CopyOut(logits_.ref(), logits, logits_.size());
  if (routes_out != nullptr) std::copy(routes_.begin(), routes_.end(), routes_out);
  return ops_->Finish();
}

absl::Status Transformer::RunLayers(int rows, AttentionBackend& attention, const int16_t* replay) {
  if (absl::Status status = weights_.Refresh(); !status.ok()) return status;
  const int d = config_.d_model;
  routes_.assign(static_cast<size_t>(rows) * moe_layers_.size() * config_.top_k, -1);
  live_routes_.assign(routes_.size(), -1);
  Buffer<float>& embedded = layers_[0].input;
  ops_->Resize(embedded, int64_t{rows} * d);
  ops_->EmbeddingGather(Weight("model.embed_tokens.weight"), token_buffer_.ref(), embedded.ref(),
                        rows, d);
  Round(embedded.ref(), embedded.size());
  for (int layer = 0; layer < config_.num_layers; ++layer) {
    if (absl::Status status = RunLayer(layer, rows, attention, replay, layers_[layer]);
        !status.ok()) {
      return status;
    }
    // The layer's output (left in ffn_out, which its backward does not read) is the next one's
    // input: the buffers trade places instead of copying.
    Buffer<float>& next = layer + 1 < config_.num_layers ? layers_[layer + 1].input : final_input_;
    std::swap(next, layers_[layer].ffn_out);
  }
  return absl::OkStatus();
}

void Transformer::KeepFinalRows(absl::Span<const int> kept) {
  const int d = config_.d_model;
  for (size_t i = 0; i < kept.size(); ++i) {
    // Ascending rows land at or before where they stand, after the rows already moved.
    if (kept[i] == static_cast<int>(i)) continue;
    ops_->Copy(final_input_.ref() + int64_t{kept[i]} * d, final_input_.ref() + int64_t(i) * d, d);
  }
  ops_->Resize(final_input_, static_cast<int64_t>(kept.size()) * d);
}

void Transformer::RunHead(int rows) {
  RunFinalNorm(rows);
  RunHeadTile(0, rows, 0, config_.vocab_size, 1.0f);
}

void Transformer::RunFinalNorm(int rows) {
  const int d = config_.d_model;
  ops_->Resize(final_norm_, int64_t{rows} * d);
  ops_->Resize(final_rstd_, rows);
  ops_->RmsNorm(final_input_.ref(), Weight("model.norm.weight"), final_norm_.ref(),
                final_rstd_.ref(), rows, d, config_.norm_eps);
  Round(final_norm_.ref(), final_norm_.size());
}

void Transformer::RunHeadTile(int first_row, int rows, int first_column, int columns,
                              float temperature) {
  const int d = config_.d_model;
  ops_->Resize(logits_, int64_t{rows} * columns);
  ops_->Linear(final_norm_.ref() + int64_t{first_row} * d,
               Weight(HeadWeightName(config_)) + int64_t{first_column} * d, logits_.ref(), rows, d,
               columns, /*accumulate=*/false);
  Round(logits_.ref(), logits_.size());
  if (temperature != 1.0f) ops_->Scale(logits_.ref(), 1.0f / temperature, logits_.size());
}

void Transformer::ForEachHeadTile(int rows,
                                  absl::FunctionRef<void(int, int, int, int)> tile) const {
  const int vocab = config_.vocab_size;
  for (int first_row = 0; first_row < rows; first_row += kHeadChunkRows) {
    const int tile_rows = std::min(kHeadChunkRows, rows - first_row);
    for (int first_column = 0; first_column < vocab; first_column += kHeadChunkColumns) {
      tile(first_row, tile_rows, first_column, std::min(kHeadChunkColumns, vocab - first_column));
    }
  }
}

absl::Status Transformer::RunLayer(int layer, int rows, AttentionBackend& attention,
                                   const int16_t* replay, LayerActivations& act) {
  const int d = config_.d_model;
  const int64_t n = static_cast<int64_t>(rows) * d;
  const std::string prefix = absl::StrCat("model.layers.", layer, ".");
  ops_->Resize(act.norm1, n);
  ops_->Resize(act.rstd1, rows);
  ops_->RmsNorm(act.input.ref(), Weight(prefix + "input_layernorm.weight"), act.norm1.ref(),
                act.rstd1.ref(), rows, d, config_.norm_eps);
  Round(act.norm1.ref(), n);
  QuantizeInput(act.norm1.ref(), rows, d);

  if (config_.latent_attention()) {
    RunLatentProjections(layer, rows, act);
  } else {
    RunStandardProjections(layer, rows, act);
  }
  const int64_t attention_size = int64_t{rows} * config_.attention_out_dim();
  ops_->Resize(act.attention, attention_size);
  attention.Attend(layer, act.q.ref(), act.k.ref(), act.v.ref(), act.attention.ref());
  Round(act.attention.ref(), attention_size);
  QuantizeInput(act.attention.ref(), rows, config_.attention_out_dim());

  // Residual: input + o_proj(attention).
  ops_->Resize(act.norm2_input, n);
  ops_->Copy(act.input.ref(), act.norm2_input.ref(), n);
  Buffer<float> projected = ops_->Allocate<float>(n);
  const std::vector<int> one_group = {0, rows};
  ops_->ProjectGroups(
      act.attention.ref(), one_group, Weight(ProjectionName(config_, layer, "o_proj")), 0,
      config_.attention_out_dim(), d, Lora(layer, "o_proj"), act.lora_o, projected.ref());
  Round(projected.ref(), n);
  ops_->Add(act.norm2_input.ref(), projected.ref(), n);
  Round(act.norm2_input.ref(), n);

  ops_->Resize(act.norm2, n);
  ops_->Resize(act.rstd2, rows);
  ops_->RmsNorm(act.norm2_input.ref(), Weight(prefix + "post_attention_layernorm.weight"),
                act.norm2.ref(), act.rstd2.ref(), rows, d, config_.norm_eps);
  Round(act.norm2.ref(), n);

  if (moe_index_[layer] >= 0) {
    if (absl::Status status = RunMoeFfn(layer, moe_index_[layer], rows, replay, act);
        !status.ok()) {
      return status;
    }
  } else {
    RunDenseFfn(layer, rows, act);
  }
  // ffn_out becomes the layer output: residual + FFN.
  ops_->Add(act.ffn_out.ref(), act.norm2_input.ref(), n);
  Round(act.ffn_out.ref(), n);
  return absl::OkStatus();
}

void Transformer::RunStandardProjections(int layer, int rows, LayerActivations& act) {
  const int d = config_.d_model;
  const std::string prefix = absl::StrCat("model.layers.", layer, ".");
  const std::vector<int> one_group = {0, rows};
  Buffer<float>* outputs[] = {&act.q, &act.k, &act.v};
  Buffer<float>* lora_h[] = {&act.lora_q, &act.lora_k, &act.lora_v};
  const char* modules[] = {"q_proj", "k_proj", "v_proj"};
  const int widths[] = {config_.q_dim(), config_.kv_dim(), config_.kv_dim()};
  for (int i = 0; i < 3; ++i) {
    const int64_t size = int64_t{rows} * widths[i];
    ops_->Resize(*outputs[i], size);
    ops_->ProjectGroups(act.norm1.ref(), one_group,
                        Weight(ProjectionName(config_, layer, modules[i])), 0, d, widths[i],
                        Lora(layer, modules[i]), *lora_h[i], outputs[i]->ref());
    Round(outputs[i]->ref(), size);
  }
  if (config_.qk_norm != QkNorm::kNone) {
    NormalizeQk(prefix + "self_attn.q_norm.weight", rows, config_.num_heads, act.q, act.q_raw,
                act.q_rstd);
    NormalizeQk(prefix + "self_attn.k_norm.weight", rows, config_.kv_heads(), act.k, act.k_raw,
                act.k_rstd);
  }
  ops_->Rope(act.q.ref(), position_buffer_.ref(), rows, config_.num_heads);
  ops_->Rope(act.k.ref(), position_buffer_.ref(), rows, config_.kv_heads());
}

void Transformer::BackwardStandardProjections(int layer, LayerActivations& act, Buffer<float>& dq,
                                              Buffer<float>& dk, const Buffer<float>& dv,
                                              Ref<float> dnorm1) {
  const int rows = static_cast<int>(tokens_.size());
  const int d = config_.d_model;
  const std::string prefix = absl::StrCat("model.layers.", layer, ".");
  ops_->RopeBackward(dq.ref(), position_buffer_.ref(), rows, config_.num_heads);
  ops_->RopeBackward(dk.ref(), position_buffer_.ref(), rows, config_.kv_heads());
  if (config_.qk_norm != QkNorm::kNone) {
    NormalizeQkBackward(prefix + "self_attn.q_norm.weight", config_.num_heads, act.q_raw,
                        act.q_rstd, dq);
    NormalizeQkBackward(prefix + "self_attn.k_norm.weight", config_.kv_heads(), act.k_raw,
                        act.k_rstd, dk);
  }
  const std::vector<int> one_group = {0, rows};
  const Buffer<float>* lora_h[] = {&act.lora_q, &act.lora_k, &act.lora_v};
  const Ref<const float> grads[] = {dq.ref(), dk.ref(), dv.ref()};
  const char* modules[] = {"q_proj", "k_proj", "v_proj"};
  const int widths[] = {config_.q_dim(), config_.kv_dim(), config_.kv_dim()};
  for (int i = 0; i < 3; ++i) {
    const WeightRef w = Weight(ProjectionName(config_, layer, modules[i]));
    ops_->ProjectGroupsBackward(act.norm1.ref(), one_group, w, 0, d, widths[i],
                                Lora(layer, modules[i]), lora_h[i]->ref(), grads[i], dnorm1);
  }
}

void Transformer::NormalizeQk(const std::string& weight, int rows, int heads, Buffer<float>& x,
                              Buffer<float>& raw, Buffer<float>& rstd) {
  ops_->Resize(raw, x.size());
  ops_->Copy(x.ref(), raw.ref(), x.size());
  const auto [norm_rows, width] = QkNormShape(config_, rows, heads);
  ops_->Resize(rstd, norm_rows);
  ops_->RmsNorm(raw.ref(), Weight(weight), x.ref(), rstd.ref(), norm_rows, width, config_.norm_eps);
  Round(x.ref(), x.size());
}

void Transformer::NormalizeQkBackward(const std::string& weight, int heads,
                                      const Buffer<float>& raw, const Buffer<float>& rstd,
                                      Buffer<float>& dx) {
  const int rows = static_cast<int>(tokens_.size());
  const auto [norm_rows, width] = QkNormShape(config_, rows, heads);
  Buffer<float> draw = ops_->Zeros(dx.size());
  const WeightRef norm = Weight(weight);
  ops_->RmsNormBackward(raw.ref(), norm, rstd.ref(), dx.ref(), draw.ref(), norm_rows, width);
  dx = std::move(draw);
}

void Transformer::RunDenseFfn(int layer, int rows, LayerActivations& act) {
  act.group_offsets = {0, rows};
  QuantizeInput(act.norm2.ref(), rows, config_.d_model);
  RunSwiGluMlp(layer, act.norm2.ref(), 0, config_.dense_ffn_dim, {}, act, act.ffn_out);
}

void Transformer::RunSwiGluMlp(int layer, Ref<const float> x, int64_t weight_stride, int ffn,
                               ExpertSlots first, LayerActivations& act, Buffer<float>& out) {
  const int d = config_.d_model;
  const int rows = act.group_offsets.back();
  const int64_t hidden = static_cast<int64_t>(rows) * ffn;
  ops_->Resize(act.gate, hidden);
  ops_->Resize(act.up, hidden);
  ops_->Resize(act.activation, hidden);
  ops_->Resize(out, int64_t{rows} * d);
  const int64_t first_weight = first.base * weight_stride;
  ops_->ProjectGroups(
      x, act.group_offsets, Weight(ProjectionName(config_, layer, "gate_proj")) + first_weight,
      weight_stride, d, ffn, Lora(layer, "gate_proj", first.lora), act.lora_gate, act.gate.ref());
  ops_->ProjectGroups(
      x, act.group_offsets, Weight(ProjectionName(config_, layer, "up_proj")) + first_weight,
      weight_stride, d, ffn, Lora(layer, "up_proj", first.lora), act.lora_up, act.up.ref());
  Round(act.gate.ref(), hidden);
  Round(act.up.ref(), hidden);
  ops_->SwiGlu(act.gate.ref(), act.up.ref(), act.activation.ref(), hidden);
  Round(act.activation.ref(), hidden);
  QuantizeInput(act.activation.ref(), rows, ffn);
  ops_->ProjectGroups(act.activation.ref(), act.group_offsets,
                      Weight(ProjectionName(config_, layer, "down_proj")) + first_weight,
                      weight_stride, ffn, d, Lora(layer, "down_proj", first.lora), act.lora_down,
                      out.ref());
  Round(out.ref(), out.size());
}

absl::Status Transformer::ReadyForBackward(Ready pass, const char* missing) const {
  if (backward_ready_ != pass) return absl::FailedPreconditionError(missing);
  if (weights_.base_trains() && !ops_->capabilities().base_gradients) {
    return absl::UnimplementedError(
        "base-model weights are frozen on this backend: its backward computes the adapter's "
        "gradients only (full fine-tuning runs on the CPU)");
  }
  return absl::OkStatus();
}

absl::Status Transformer::Backward(const float* dlogits_on_host, const float* dhidden) {
  if (absl::Status ready = ReadyForBackward(
          Ready::kLogits,
          "Backward needs the activations of a Forward (none yet, or a decode overwrote them)");
      !ready.ok()) {
    return ready;
  }
  const int rows = static_cast<int>(tokens_.size());
  const int d = config_.d_model;
  const int64_t n = int64_t{rows} * d;
  Buffer<float> dlogits;
  ops_->Upload(dlogits_on_host, int64_t{rows} * config_.vocab_size, dlogits);
  Buffer<float> dnorm = ops_->Zeros(n);
  if (dhidden != nullptr) ops_->Upload(dhidden, n, dnorm);
  ops_->LinearBackward(final_norm_.ref(), Weight(HeadWeightName(config_)), dlogits.ref(),
                       dnorm.ref(), rows, d, config_.vocab_size);
  return BackwardFromFinalNorm(dnorm);
}

absl::Status Transformer::BackwardLogProbs(const float* dlogp_on_host, const float* dhidden) {
  if (absl::Status ready = ReadyForBackward(
          Ready::kLogProbs,
          "BackwardLogProbs needs the activations of a ForwardLogProbs (none yet, or another "
          "pass overwrote them)");
      !ready.ok()) {
    return ready;
  }
  const int rows = static_cast<int>(tokens_.size());
  const int d = config_.d_model;
  const int64_t n = int64_t{rows} * d;
  std::vector<float> scored(rows, 0.0f);  // Rows without a target pass no gradient.
  for (int t = 0; t < rows && dlogp_on_host != nullptr; ++t) {
    if (targets_[t] >= 0) scored[t] = dlogp_on_host[t];
  }
  Buffer<float> dlogp;
  ops_->Upload(scored.data(), rows, dlogp);
  Buffer<float> dnorm = ops_->Zeros(n);
  if (dhidden != nullptr) ops_->Upload(dhidden, n, dnorm);
  Buffer<float> dlogits;
  ForEachHeadTile(rows, [&](int first_row, int tile_rows, int first_column, int columns) {
    RunHeadTile(first_row, tile_rows, first_column, columns, temperature_);  // Not kept.
    ops_->Resize(dlogits, int64_t{tile_rows} * columns);
    ops_->TokenLogProbsChunkBackward(logits_.ref(), target_buffer_.ref() + first_row,
                                     log_sum_exps_.ref() + first_row, dlogp.ref() + first_row,
                                     dlogits.ref(), tile_rows, first_column, columns);
    if (temperature_ != 1.0f) ops_->Scale(dlogits.ref(), 1.0f / temperature_, dlogits.size());
    ops_->LinearBackward(final_norm_.ref() + int64_t{first_row} * d,
                         Weight(HeadWeightName(config_)) + int64_t{first_column} * d, dlogits.ref(),
                         dnorm.ref() + int64_t{first_row} * d, tile_rows, d, columns);
  });
  return BackwardFromFinalNorm(dnorm);
}

absl::Status Transformer::BackwardFromFinalNorm(Buffer<float>& dnorm) {
  const int rows = static_cast<int>(tokens_.size());
  const int d = config_.d_model;
  Buffer<float> dx = ops_->Zeros(int64_t{rows} * d);
  ops_->RmsNormBackward(final_input_.ref(), Weight("model.norm.weight"), final_rstd_.ref(),
                        dnorm.ref(), dx.ref(), rows, d);
  for (int layer = config_.num_layers - 1; layer >= 0; --layer) {
    if (absl::Status status = BackwardLayer(layer, dx.ref()); !status.ok()) {
      return Finished(status);
    }
  }
  const WeightRef embedding = Weight("model.embed_tokens.weight");
  if (embedding.trains()) {
    ops_->EmbeddingBackward(dx.ref(), token_buffer_.ref(), embedding, rows, d);
  }
  return ops_->Finish();
}

// On entry dx holds d(loss)/d(layer output); on exit d(loss)/d(layer input).
absl::Status Transformer::BackwardLayer(int layer, Ref<float> dx) {
  LayerActivations& act = layers_[layer];
  const int rows = static_cast<int>(tokens_.size());
  const int d = config_.d_model;
  const int64_t n = static_cast<int64_t>(rows) * d;
  const std::string prefix = absl::StrCat("model.layers.", layer, ".");

  // FFN and its norm; the residual passes dx straight to the FFN block's input.
  Buffer<float> dnorm2 = ops_->Zeros(n);
  if (moe_index_[layer] >= 0) {
    if (absl::Status status = BackwardMoeFfn(layer, dx, dnorm2.ref()); !status.ok()) {
      return status;
    }
  } else {
    BackwardDenseFfn(layer, dx, dnorm2.ref());
  }
  Buffer<float> dmid = ops_->Allocate<float>(n);
  ops_->Copy(dx, dmid.ref(), n);
  const WeightRef post_norm = Weight(prefix + "post_attention_layernorm.weight");
  ops_->RmsNormBackward(act.norm2_input.ref(), post_norm, act.rstd2.ref(), dnorm2.ref(), dmid.ref(),
                        rows, d);

  // Attention block.
  const std::vector<int> one_group = {0, rows};
  const kernels::AttentionShape shape = config_.attention_shape();
  const int out_width = config_.attention_out_dim();
  const int q_width = config_.query_width();
  const int k_width = config_.key_width();
  const int v_width = config_.value_width();
  Buffer<float> dattention = ops_->Zeros(int64_t{rows} * out_width);
  const WeightRef o = Weight(ProjectionName(config_, layer, "o_proj"));
  ops_->ProjectGroupsBackward(act.attention.ref(), one_group, o, 0, out_width, d,
                              Lora(layer, "o_proj"), act.lora_o.ref(), dmid.ref(),
                              dattention.ref());
  Buffer<float> dq = ops_->Zeros(int64_t{rows} * q_width);
  Buffer<float> dk = ops_->Zeros(int64_t{rows} * k_width);
  Buffer<float> dv = ops_->Zeros(int64_t{rows} * v_width);
  int64_t probs_offset = 0;
  for (size_t s = 0; s + 1 < sequence_starts_.size(); ++s) {
    const int begin = sequence_starts_[s];
    const int length = sequence_starts_[s + 1] - begin;
    ops_->CausalAttentionBackward(
        act.q.ref() + int64_t{begin} * q_width, act.k.ref() + int64_t{begin} * k_width,
        act.v.ref() + int64_t{begin} * v_width, attention_probs_[layer].ref() + probs_offset,
        dattention.ref() + int64_t{begin} * out_width, dq.ref() + int64_t{begin} * q_width,
        dk.ref() + int64_t{begin} * k_width, dv.ref() + int64_t{begin} * v_width, length, shape);
    probs_offset += int64_t{shape.heads} * length * length;
  }
  Buffer<float> dnorm1 = ops_->Zeros(n);
  if (config_.latent_attention()) {
    BackwardLatentProjections(layer, act, dq, dk, dv, dnorm1.ref());
  } else {
    BackwardStandardProjections(layer, act, dq, dk, dv, dnorm1.ref());
  }
  ops_->Copy(dmid.ref(), dx, n);  // Residual around attention.
  const WeightRef input_norm = Weight(prefix + "input_layernorm.weight");
  ops_->RmsNormBackward(act.input.ref(), input_norm, act.rstd1.ref(), dnorm1.ref(), dx, rows, d);
  return absl::OkStatus();
}

void Transformer::BackwardDenseFfn(int layer, Ref<const float> dy, Ref<float> dnorm2) {
  LayerActivations& act = layers_[layer];
  BackwardSwiGluMlp(layer, act.norm2.ref(), 0, config_.dense_ffn_dim, {}, act, dy, dnorm2);
}

void Transformer::BackwardSwiGluMlp(int layer, Ref<const float> x, int64_t weight_stride, int ffn,
                                    ExpertSlots first, LayerActivations& act, Ref<const float> dy,
                                    Ref<float> dx) {
  const int d = config_.d_model;
  const int64_t hidden = static_cast<int64_t>(act.group_offsets.back()) * ffn;
  const int64_t first_weight = first.base * weight_stride;
  // A projection's weight from the first group on.
  auto from_first = [&](const char* module) {
    return Weight(ProjectionName(config_, layer, module)) + first_weight;
  };
  Buffer<float> dactivation = ops_->Zeros(hidden);
  Buffer<float> dgate = ops_->Zeros(hidden);
  Buffer<float> dup = ops_->Zeros(hidden);
  ops_->ProjectGroupsBackward(act.activation.ref(), act.group_offsets, from_first("down_proj"),
                              weight_stride, ffn, d, Lora(layer, "down_proj", first.lora),
                              act.lora_down.ref(), dy, dactivation.ref());
  ops_->SwiGluBackward(act.gate.ref(), act.up.ref(), dactivation.ref(), dgate.ref(), dup.ref(),
                       hidden);
  ops_->ProjectGroupsBackward(x, act.group_offsets, from_first("gate_proj"), weight_stride, d, ffn,
                              Lora(layer, "gate_proj", first.lora), act.lora_gate.ref(),
                              dgate.ref(), dx);
  ops_->ProjectGroupsBackward(x, act.group_offsets, from_first("up_proj"), weight_stride, d, ffn,
                              Lora(layer, "up_proj", first.lora), act.lora_up.ref(), dup.ref(), dx);
}

}  // namespace tandem::engine
