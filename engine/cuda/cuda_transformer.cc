#include "engine/cuda/cuda_transformer.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_transformer_state.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/grouped_lora.h"
#include "kernels/cuda/permute.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/router.h"
#include "kernels/cuda/swiglu.h"

namespace tandem::engine::cuda {

namespace {

int64_t ProbsSize(const std::vector<int>& starts, int heads) {
  int64_t size = 0;
  for (size_t s = 0; s + 1 < starts.size(); ++s) {
    const int64_t length = starts[s + 1] - starts[s];
    size += heads * length * length;
  }
  return size;
}

template <typename T>
absl::Status Upload(DeviceArray<T>& array, const std::vector<T>& host) {
  absl::StatusOr<DeviceArray<T>> uploaded = DeviceArray<T>::FromHost(host);
  if (!uploaded.ok()) return uploaded.status();
  array = *std::move(uploaded);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaTransformer>> CudaTransformer::Create(const BaseModel& model,
                                                                         LoraAdapter* lora,
                                                                         Options options) {
  if (options.precision != Precision::kF32 && options.precision != Precision::kBF16) {
    return absl::UnimplementedError("FP8 and INT8 inference do not run on CUDA yet");
  }
  const int device = options.device;
  std::shared_ptr<const DeviceParameters> base = std::move(options.base);
  if (model.config().latent_attention()) {
    return absl::UnimplementedError("latent attention does not run on CUDA yet");
  }
  if (model.config().num_expert_groups > 64) {
    return absl::UnimplementedError(absl::StrCat("the CUDA router limits routing to 64 groups; ",
                                                 model.config().num_expert_groups, " asked"));
  }
  if (absl::Status status = gpu::SelectDevice(device).status(); !status.ok()) return status;
  if (base == nullptr) {
    absl::StatusOr<DeviceParameters> uploaded = DeviceParameters::Upload(model.parameters());
    if (!uploaded.ok()) return uploaded.status();
    base = std::make_shared<const DeviceParameters>(*std::move(uploaded));
  }
  std::unique_ptr<DeviceParameters> adapter;
  if (lora != nullptr) {
    absl::StatusOr<DeviceParameters> uploaded = DeviceParameters::Upload(lora->parameters());
    if (!uploaded.ok()) return uploaded.status();
    adapter = std::make_unique<DeviceParameters>(*std::move(uploaded));
  }
  absl::StatusOr<gpu::DeviceRopeFrequencies> rope =
      gpu::DeviceRopeFrequencies::Upload(model.config().RopeFrequencies());
  if (!rope.ok()) return rope.status();
  return std::unique_ptr<CudaTransformer>(
      new CudaTransformer(model, lora, device, options.precision, std::move(base),
                          std::move(adapter), *std::move(rope)));
}

CudaTransformer::CudaTransformer(const BaseModel& model, LoraAdapter* lora, int device,
                                 Precision precision, std::shared_ptr<const DeviceParameters> base,
                                 std::unique_ptr<DeviceParameters> adapter,
                                 gpu::DeviceRopeFrequencies rope)
    : config_(model.config()),
      device_(device),
      precision_(precision),
      model_(model),
      lora_(lora),
      base_(std::move(base)),
      adapter_(std::move(adapter)),
      rope_(std::move(rope)),
      moe_layers_(config_.MoeLayerIndices()),
      moe_index_(config_.num_layers, -1) {
  for (size_t m = 0; m < moe_layers_.size(); ++m) moe_index_[moe_layers_[m]] = static_cast<int>(m);
}

CudaTransformer::~CudaTransformer() = default;

absl::Status CudaTransformer::AdapterChanged() {
  if (lora_ == nullptr) return absl::OkStatus();
  TANDEM_RETURN_IF_ERROR(gpu::UseDevice(device_));
  return adapter_->Refresh(lora_->parameters());
}

const float* CudaTransformer::Weight(const std::string& name) const { return base_->Find(name); }

absl::Status CudaTransformer::Round(float* x, int64_t n) const {
  if (precision_ == Precision::kF32) return absl::OkStatus();
  return gpu::RoundToBf16(x, n);
}

std::optional<LoraProjection> CudaTransformer::DeviceLora(int layer, const char* module) const {
  if (lora_ == nullptr) return std::nullopt;
  // The device tensors never move (AdapterChanged copies into them), so each projection is
  // looked up once; the cache starts over when the gradient tensors appear.
  const std::pair<int, std::string> key(layer, module);
  auto cached = device_lora_.find(key);
  if (cached != device_lora_.end()) return cached->second;
  std::optional<LoraProjection> projection = lora_->Projection(layer, module);
  if (!projection.has_value()) {
    device_lora_.emplace(key, std::nullopt);
    return std::nullopt;
  }
  // Host pointers into the adapter's tensors, translated to the same places on the device.
  const ParameterSet& host = lora_->parameters();
  const float* host_a = projection->weights.a;
  const float* host_b = projection->weights.b;
  projection->weights.a = adapter_->Translate(host, host_a);
  projection->weights.b = adapter_->Translate(host, host_b);
  projection->a_grad = adapter_grads_ ? adapter_grads_->Translate(host, host_a) : nullptr;
  projection->b_grad = adapter_grads_ ? adapter_grads_->Translate(host, host_b) : nullptr;
  device_lora_.emplace(key, projection);
  return projection;
}

absl::Status CudaTransformer::AllocateLayer(int layer, Activations& act) const {
  const int64_t rows = pass_->rows, d = config_.d_model, k = config_.top_k;
  const bool moe = moe_index_[layer] >= 0;
  const int64_t ffn_rows = moe ? rows * k : rows;
  const int64_t ffn = moe ? config_.expert_ffn_dim : config_.dense_ffn_dim;
  const int64_t shared_ffn = moe ? config_.shared_expert_ffn_dim() : 0;
  const int64_t rank = lora_ == nullptr ? 0 : lora_->config().rank;
  const int64_t experts = moe ? config_.num_experts : 0;
  const std::pair<DeviceArray<float> Activations::*, int64_t> buffers[] = {
      {&Activations::norm1, rows * d},
      {&Activations::rstd1, rows},
      {&Activations::q_raw, rows * config_.query_width()},
      {&Activations::q_rstd, rows * config_.num_heads},
      {&Activations::k_raw, rows * config_.key_width()},
      {&Activations::k_rstd, rows * config_.kv_heads()},
      {&Activations::q, rows * config_.query_width()},
      {&Activations::k, rows * config_.key_width()},
      {&Activations::v, rows * config_.value_width()},
      {&Activations::probs, ProbsSize(pass_->sequence_starts, config_.num_heads)},
      {&Activations::attention, rows * config_.attention_out_dim()},
      {&Activations::mid, rows * d},
      {&Activations::norm2, rows * d},
      {&Activations::rstd2, rows},
      {&Activations::ffn_in, moe ? ffn_rows * d : 0},
      {&Activations::gate, ffn_rows * ffn},
      {&Activations::up, ffn_rows * ffn},
      {&Activations::activation, ffn_rows * ffn},
      {&Activations::ffn_rows_out, moe ? ffn_rows * d : 0},
      {&Activations::lora_q, rows * rank},
      {&Activations::lora_k, rows * rank},
      {&Activations::lora_v, rows * rank},
      {&Activations::lora_o, rows * rank},
      {&Activations::lora_gate, ffn_rows * rank},
      {&Activations::lora_up, ffn_rows * rank},
      {&Activations::lora_down, ffn_rows * rank},
      {&Activations::router_logits, rows * experts},
      {&Activations::scores, rows * experts},
      {&Activations::gate_weights, moe ? rows * k : 0},
      {&Activations::shared_gate, rows * shared_ffn},
      {&Activations::shared_up, rows * shared_ffn},
      {&Activations::shared_activation, rows * shared_ffn},
  };
  for (const auto& [buffer, size] : buffers) TANDEM_RETURN_IF_ERROR(Allocate(act.*buffer, size));
  if (!moe) return absl::OkStatus();
  TANDEM_RETURN_IF_ERROR(Allocate(act.ids, rows * k));
  absl::StatusOr<gpu::DevicePermutation> permutation =
      gpu::DevicePermutation::Allocate(pass_->rows, config_.top_k, config_.num_experts);
  if (!permutation.ok()) return permutation.status();
  act.permutation = *std::move(permutation);
  return absl::OkStatus();
}

absl::StatusOr<const float*> CudaTransformer::Forward(const TokenBatch& batch,
                                                      const std::vector<int16_t>* replay) {
  TANDEM_RETURN_IF_ERROR(CheckForwardInput(config_, batch, replay));
  std::vector<int> positions(batch.num_tokens());
  for (int s = 0; s < batch.num_sequences(); ++s) {
    for (int t = batch.sequence_starts[s]; t < batch.sequence_starts[s + 1]; ++t) {
      positions[t] = t - batch.sequence_starts[s];
    }
  }
  TANDEM_RETURN_IF_ERROR(RunPass(batch.tokens.data(), std::move(positions), batch.sequence_starts,
                                 replay, {}, PassMode::kPackedSequences));
  return logits_.data();
}

absl::StatusOr<std::unique_ptr<SequenceCache>> CudaTransformer::NewCache(int positions) {
  if (positions < 1 || positions > config_.max_seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("a cache of ", positions, " positions; allowed 1..", config_.max_seq_len));
  }
  TANDEM_RETURN_IF_ERROR(gpu::UseDevice(device_));
  auto cache = std::make_unique<DeviceSequenceCache>();
  cache->keys.resize(config_.num_layers);
  cache->values.resize(config_.num_layers);
  for (int layer = 0; layer < config_.num_layers; ++layer) {
    TANDEM_RETURN_IF_ERROR(Allocate(cache->keys[layer], int64_t{positions} * config_.key_width()));
    TANDEM_RETURN_IF_ERROR(
        Allocate(cache->values[layer], int64_t{positions} * config_.value_width()));
  }
  return cache;
}

void CudaTransformer::CopyOutputs(float* logits, int16_t* routes) const {
  std::copy(logits_.begin(), logits_.end(), logits);
  if (routes != nullptr) std::copy(routes_.begin(), routes_.end(), routes);
}

absl::Status CudaTransformer::Prefill(const std::vector<PromptToPrefill>& prompts,
                                      float* last_logits, int16_t* routes) {
  if (prompts.empty()) return absl::OkStatus();
  std::vector<int> tokens, positions, starts = {0};
  std::vector<DeviceSequenceCache*> caches;
  for (size_t s = 0; s < prompts.size(); ++s) {
    const PromptToPrefill& prompt = prompts[s];
    if (prompt.length < 1 || prompt.length > Capacity(*prompt.cache)) {
      return absl::InvalidArgumentError(absl::StrCat("prompt ", s, " of ", prompt.length,
                                                     " tokens for a cache of ",
                                                     Capacity(*prompt.cache), " positions"));
    }
    tokens.insert(tokens.end(), prompt.tokens, prompt.tokens + prompt.length);
    for (int t = 0; t < prompt.length; ++t) positions.push_back(t);
    starts.push_back(starts.back() + prompt.length);
    caches.push_back(static_cast<DeviceSequenceCache*>(prompt.cache));
  }
  TANDEM_RETURN_IF_ERROR(RunPass(tokens.data(), std::move(positions), std::move(starts), nullptr,
                                 std::move(caches), PassMode::kPrefill));
  CopyOutputs(last_logits, routes);
  return absl::OkStatus();
}

absl::Status CudaTransformer::Decode(const int* tokens, const int* positions,
                                     const std::vector<SequenceCache*>& caches, float* logits,
                                     int16_t* routes) {
  const int rows = static_cast<int>(caches.size());
  for (int row = 0; row < rows; ++row) {
    if (positions[row] < 0 || positions[row] >= Capacity(*caches[row])) {
      return absl::InvalidArgumentError(absl::StrCat("row ", row, " decodes position ",
                                                     positions[row], " of a cache of ",
                                                     Capacity(*caches[row]), " positions"));
    }
  }
  std::vector<DeviceSequenceCache*> device_caches;
  std::vector<int> starts;  // Each row is a sequence of its own for the pass's bookkeeping.
  for (int row = 0; row <= rows; ++row) starts.push_back(row);
  for (SequenceCache* cache : caches) {
    device_caches.push_back(static_cast<DeviceSequenceCache*>(cache));
  }
  TANDEM_RETURN_IF_ERROR(RunPass(tokens, std::vector<int>(positions, positions + rows),
                                 std::move(starts), nullptr, std::move(device_caches),
                                 PassMode::kDecode));
  CopyOutputs(logits, routes);
  return absl::OkStatus();
}

absl::Status CudaTransformer::RunPass(const int* tokens, std::vector<int> positions,
                                      std::vector<int> sequence_starts,
                                      const std::vector<int16_t>* replay,
                                      std::vector<DeviceSequenceCache*> caches, PassMode mode) {
  absl::Status status = BeginPass(tokens, std::move(positions), std::move(sequence_starts), replay,
                                  std::move(caches), mode);
  if (status.ok()) status = RunLayers();
  // Keep activations only for a Backward that can use them: not after a failure, a generation
  // pass, or in an engine without an adapter (the reference model).
  if (!status.ok() || mode != PassMode::kPackedSequences || lora_ == nullptr) pass_.reset();
  return status;
}

absl::Status CudaTransformer::BeginPass(const int* tokens, std::vector<int> positions,
                                        std::vector<int> sequence_starts,
                                        const std::vector<int16_t>* replay,
                                        std::vector<DeviceSequenceCache*> caches, PassMode mode) {
  TANDEM_RETURN_IF_ERROR(gpu::UseDevice(device_));
  pass_ = std::make_unique<Pass>();
  Pass& pass = *pass_;
  pass.mode = mode;
  pass.rows = static_cast<int>(positions.size());
  pass.sequence_starts = std::move(sequence_starts);
  pass.replay = replay;
  pass.caches = std::move(caches);
  pass.token_replayed.assign(pass.rows, 0);
  pass.token_differs.assign(pass.rows, 0);
  const int64_t rows = pass.rows, d = config_.d_model;
  TANDEM_RETURN_IF_ERROR(Upload(pass.tokens, std::vector<int>(tokens, tokens + rows)));
  TANDEM_RETURN_IF_ERROR(Upload(pass.positions, positions));
  pass.host_positions = std::move(positions);
  TANDEM_RETURN_IF_ERROR(Upload(pass.dense_offsets, std::vector<int>{0, pass.rows}));
  pass.layers.resize(config_.num_layers);
  for (int layer = 0; layer < config_.num_layers; ++layer) {
    TANDEM_RETURN_IF_ERROR(Allocate(pass.layers[layer].input, rows * d));
    TANDEM_RETURN_IF_ERROR(AllocateLayer(layer, pass.layers[layer]));
  }
  TANDEM_RETURN_IF_ERROR(Allocate(pass.final_input, rows * d));
  TANDEM_RETURN_IF_ERROR(Allocate(pass.final_rstd, rows));
  TANDEM_RETURN_IF_ERROR(Allocate(pass.final_norm, rows * d));
  if (mode == PassMode::kPrefill) {
    // Generation samples from each prompt's last position only: the head runs on those rows.
    std::vector<int> last_rows;
    for (size_t s = 1; s < pass.sequence_starts.size(); ++s) {
      last_rows.push_back(pass.sequence_starts[s] - 1);
    }
    pass.logit_rows = static_cast<int>(last_rows.size());
    TANDEM_RETURN_IF_ERROR(Upload(pass.last_rows, last_rows));
    TANDEM_RETURN_IF_ERROR(Allocate(pass.last_rows_norm, int64_t{pass.logit_rows} * d));
  } else {
    pass.logit_rows = pass.rows;
  }
  TANDEM_RETURN_IF_ERROR(Allocate(pass.logits, int64_t{pass.logit_rows} * config_.vocab_size));
  if (mode != PassMode::kDecode) return absl::OkStatus();
  // Each row's cache, per layer, and how many positions it holds after this token.
  std::vector<float*> keys, values;
  for (int layer = 0; layer < config_.num_layers; ++layer) {
    for (DeviceSequenceCache* cache : pass.caches) {
      keys.push_back(cache->keys[layer].data());
      values.push_back(cache->values[layer].data());
    }
  }
  std::vector<int> lengths(pass.host_positions);
  for (int& length : lengths) ++length;
  TANDEM_RETURN_IF_ERROR(Upload(pass.cache_keys, keys));
  TANDEM_RETURN_IF_ERROR(Upload(pass.cache_values, values));
  TANDEM_RETURN_IF_ERROR(Upload(pass.cache_lengths, lengths));
  return Allocate(pass.decode_scores, rows * config_.num_heads * config_.max_seq_len);
}

int CudaTransformer::Capacity(const SequenceCache& cache) const {
  const auto* device = dynamic_cast<const DeviceSequenceCache*>(&cache);
  if (device == nullptr || device->keys.empty()) return 0;  // Not a cache of this engine's kind.
  return static_cast<int>(device->keys.front().size() / config_.key_width());
}

absl::Status CudaTransformer::RunLayers() {
  Pass& pass = *pass_;
  const int64_t rows = pass.rows, d = config_.d_model;
  stats_ = RoutingStats{};
  routes_.assign(rows * moe_layers_.size() * config_.top_k, -1);
  live_routes_.assign(routes_.size(), -1);
  float* first_input =
      config_.num_layers > 0 ? pass.layers[0].input.data() : pass.final_input.data();
  TANDEM_RETURN_IF_ERROR(gpu::EmbeddingGather(Weight("model.embed_tokens.weight"),
                                              pass.tokens.data(), first_input, pass.rows, d));
  TANDEM_RETURN_IF_ERROR(Round(first_input, rows * d));
  for (int layer = 0; layer < config_.num_layers; ++layer) {
    float* out = layer + 1 < config_.num_layers ? pass.layers[layer + 1].input.data()
                                                : pass.final_input.data();
    TANDEM_RETURN_IF_ERROR(RunLayer(layer, pass.layers[layer].input.data(), out));
  }
  TANDEM_RETURN_IF_ERROR(gpu::RmsNorm(pass.final_input.data(), Weight("model.norm.weight"),
                                      pass.final_norm.data(), pass.final_rstd.data(), pass.rows, d,
                                      config_.norm_eps));
  TANDEM_RETURN_IF_ERROR(Round(pass.final_norm.data(), rows * d));
  const float* head_input = pass.final_norm.data();
  if (pass.mode == PassMode::kPrefill) {
    TANDEM_RETURN_IF_ERROR(gpu::EmbeddingGather(head_input, pass.last_rows.data(),
                                                pass.last_rows_norm.data(), pass.logit_rows, d));
    head_input = pass.last_rows_norm.data();
  }
  const int64_t logits_size = int64_t{pass.logit_rows} * config_.vocab_size;
  TANDEM_RETURN_IF_ERROR(Linear(head_input, HeadWeightName(config_), pass.logit_rows, d,
                                config_.vocab_size, pass.logits.data()));
  TANDEM_RETURN_IF_ERROR(Round(pass.logits.data(), logits_size));
  if (pass.replay == nullptr) TANDEM_RETURN_IF_ERROR(CollectLiveRoutes());
  logits_.resize(logits_size);
  TANDEM_RETURN_IF_ERROR(
      gpu::CopyToHost(logits_.data(), pass.logits.data(), logits_.size() * sizeof(float)));
  // The hidden states feed heads outside the model in training; generation has no use for them.
  final_hidden_.clear();
  if (pass.mode == PassMode::kPackedSequences) {
    final_hidden_.resize(rows * d);
    TANDEM_RETURN_IF_ERROR(gpu::CopyToHost(final_hidden_.data(), pass.final_norm.data(),
                                           final_hidden_.size() * sizeof(float)));
  }
  pass.replay = nullptr;  // The caller's; not needed after the pass.
  for (int t = 0; t < pass.rows; ++t) {
    stats_.tokens += pass.token_replayed[t];
    stats_.differing_tokens += pass.token_differs[t];
  }
  return absl::OkStatus();
}

// out = x + attention block; out += FFN block (the two residual connections).
absl::Status CudaTransformer::RunLayer(int layer, const float* x, float* out) {
  Activations& act = pass_->layers[layer];
  const int rows = pass_->rows, d = config_.d_model;
  const int64_t n = int64_t{rows} * d;
  const std::string prefix = absl::StrCat("model.layers.", layer, ".");
  TANDEM_RETURN_IF_ERROR(gpu::RmsNorm(x, Weight(prefix + "input_layernorm.weight"),
                                      act.norm1.data(), act.rstd1.data(), rows, d,
                                      config_.norm_eps));
  TANDEM_RETURN_IF_ERROR(Round(act.norm1.data(), n));
  TANDEM_RETURN_IF_ERROR(RunAttention(layer, act));
  TANDEM_RETURN_IF_ERROR(Round(act.attention.data(), int64_t{rows} * config_.attention_out_dim()));
  TANDEM_RETURN_IF_ERROR(Project(layer, "o_proj", act.attention.data(), pass_->dense_offsets.data(),
                                 1, rows, 0, config_.attention_out_dim(), d, act.lora_o.data(),
                                 act.mid.data()));
  TANDEM_RETURN_IF_ERROR(Round(act.mid.data(), n));
  TANDEM_RETURN_IF_ERROR(gpu::AddInPlace(x, act.mid.data(), n));
  TANDEM_RETURN_IF_ERROR(Round(act.mid.data(), n));
  TANDEM_RETURN_IF_ERROR(
      gpu::RmsNorm(act.mid.data(), Weight(prefix + "post_attention_layernorm.weight"),
                   act.norm2.data(), act.rstd2.data(), rows, d, config_.norm_eps));
  TANDEM_RETURN_IF_ERROR(Round(act.norm2.data(), n));
  if (moe_index_[layer] >= 0) {
    TANDEM_RETURN_IF_ERROR(RunMoeFfn(layer, act, out));
  } else {
    TANDEM_RETURN_IF_ERROR(RunSwiGluMlp(layer, act.norm2.data(), pass_->dense_offsets.data(), 1,
                                        rows, 0, config_.dense_ffn_dim, act, out));
  }
  TANDEM_RETURN_IF_ERROR(gpu::AddInPlace(act.mid.data(), out, n));
  return Round(out, n);
}

absl::Status CudaTransformer::RunAttention(int layer, Activations& act) {
  const int rows = pass_->rows, d = config_.d_model;
  const std::string prefix = absl::StrCat("model.layers.", layer, ".self_attn.");
  const int* one_group = pass_->dense_offsets.data();
  const bool normalized = config_.qk_norm != QkNorm::kNone;
  // With q/k norms the projections land in *_raw and the norms write q and k.
  float* q = normalized ? act.q_raw.data() : act.q.data();
  float* k = normalized ? act.k_raw.data() : act.k.data();
  TANDEM_RETURN_IF_ERROR(Project(layer, "q_proj", act.norm1.data(), one_group, 1, rows, 0, d,
                                 config_.q_dim(), act.lora_q.data(), q));
  TANDEM_RETURN_IF_ERROR(Project(layer, "k_proj", act.norm1.data(), one_group, 1, rows, 0, d,
                                 config_.kv_dim(), act.lora_k.data(), k));
  TANDEM_RETURN_IF_ERROR(Project(layer, "v_proj", act.norm1.data(), one_group, 1, rows, 0, d,
                                 config_.kv_dim(), act.lora_v.data(), act.v.data()));
  TANDEM_RETURN_IF_ERROR(Round(q, int64_t{rows} * config_.q_dim()));
  TANDEM_RETURN_IF_ERROR(Round(k, int64_t{rows} * config_.kv_dim()));
  TANDEM_RETURN_IF_ERROR(Round(act.v.data(), int64_t{rows} * config_.kv_dim()));
  if (normalized) {
    // Per head (Qwen3) or over the whole projection (OLMoE).
    const bool per_head = config_.qk_norm == QkNorm::kPerHead;
    const int head_dim = config_.head_dim();
    TANDEM_RETURN_IF_ERROR(
        gpu::RmsNorm(act.q_raw.data(), Weight(prefix + "q_norm.weight"), act.q.data(),
                     act.q_rstd.data(), per_head ? rows * config_.num_heads : rows,
                     per_head ? head_dim : config_.num_heads * head_dim, config_.norm_eps));
    TANDEM_RETURN_IF_ERROR(
        gpu::RmsNorm(act.k_raw.data(), Weight(prefix + "k_norm.weight"), act.k.data(),
                     act.k_rstd.data(), per_head ? rows * config_.kv_heads() : rows,
                     per_head ? head_dim : config_.kv_heads() * head_dim, config_.norm_eps));
    TANDEM_RETURN_IF_ERROR(Round(act.q.data(), int64_t{rows} * config_.q_dim()));
    TANDEM_RETURN_IF_ERROR(Round(act.k.data(), int64_t{rows} * config_.kv_dim()));
  }
  const int* positions = pass_->positions.data();
  TANDEM_RETURN_IF_ERROR(gpu::Rope(act.q.data(), positions, rows, config_.num_heads, rope_));
  TANDEM_RETURN_IF_ERROR(gpu::Rope(act.k.data(), positions, rows, config_.kv_heads(), rope_));
  if (pass_->mode == PassMode::kDecode) return AttendOverCaches(layer, act);
  // Each packed sequence attends within itself; its probabilities follow the previous one's.
  const cpu::AttentionShape shape = config_.attention_shape();
  const int64_t q_width = config_.query_width(), k_width = config_.key_width();
  const int64_t v_width = config_.value_width(), out_width = config_.attention_out_dim();
  const std::vector<int>& starts = pass_->sequence_starts;
  int64_t probs_offset = 0;
  for (size_t s = 0; s + 1 < starts.size(); ++s) {
    const int64_t begin = starts[s];
    const int length = starts[s + 1] - starts[s];
    TANDEM_RETURN_IF_ERROR(gpu::CausalAttention(
        act.q.data() + begin * q_width, act.k.data() + begin * k_width,
        act.v.data() + begin * v_width, act.attention.data() + begin * out_width,
        act.probs.data() + probs_offset, length, shape));
    probs_offset += int64_t{shape.heads} * length * length;
  }
  if (pass_->mode != PassMode::kPrefill) return absl::OkStatus();
  // Each prompt's keys and values, already rotated, become its cache's first rows.
  for (size_t s = 0; s + 1 < starts.size(); ++s) {
    DeviceSequenceCache& cache = *pass_->caches[s];
    const int64_t begin = starts[s], length = starts[s + 1] - starts[s];
    TANDEM_RETURN_IF_ERROR(gpu::CopyOnDevice(cache.keys[layer].data(),
                                             act.k.data() + begin * k_width,
                                             length * k_width * sizeof(float)));
    TANDEM_RETURN_IF_ERROR(gpu::CopyOnDevice(cache.values[layer].data(),
                                             act.v.data() + begin * v_width,
                                             length * v_width * sizeof(float)));
  }
  return absl::OkStatus();
}

// One row per sequence: its key and value join the sequence's cache at its position, then the
// row attends over the cache; both for every row in one launch.
absl::Status CudaTransformer::AttendOverCaches(int layer, Activations& act) {
  const int rows = pass_->rows;
  float* const* keys = pass_->cache_keys.data() + int64_t{layer} * rows;
  float* const* values = pass_->cache_values.data() + int64_t{layer} * rows;
  TANDEM_RETURN_IF_ERROR(gpu::AppendToCaches(act.k.data(), act.v.data(), keys, values,
                                             pass_->positions.data(), rows, config_.key_width(),
                                             config_.value_width()));
  return gpu::BatchedDecodeAttention(act.q.data(), keys, values, pass_->cache_lengths.data(), rows,
                                     config_.max_seq_len, act.attention.data(),
                                     config_.attention_shape(), pass_->decode_scores.data());
}

absl::Status CudaTransformer::RunMoeFfn(int layer, Activations& act, float* out) {
  const int rows = pass_->rows, d = config_.d_model;
  const int experts = config_.num_experts, k = config_.top_k, ffn = config_.expert_ffn_dim;
  const std::string prefix = absl::StrCat("model.layers.", layer, ".mlp.");
  TANDEM_RETURN_IF_ERROR(
      Linear(act.norm2.data(), prefix + "gate.weight", rows, d, experts, act.router_logits.data()));
  TANDEM_RETURN_IF_ERROR(Round(act.router_logits.data(), int64_t{rows} * experts));
  TANDEM_RETURN_IF_ERROR(gpu::RouterScores(act.router_logits.data(), act.scores.data(), rows,
                                           experts, config_.scoring));
  TANDEM_RETURN_IF_ERROR(RouteLayer(layer, act));
  TANDEM_RETURN_IF_ERROR(gpu::GateWeights(act.scores.data(), act.ids.data(), rows, experts, k,
                                          config_.norm_topk_prob, act.gate_weights.data()));
  TANDEM_RETURN_IF_ERROR(
      gpu::ScaleInPlace(act.gate_weights.data(), config_.routed_scaling_factor, int64_t{rows} * k));
  gpu::DevicePermutation& permutation = *act.permutation;
  TANDEM_RETURN_IF_ERROR(gpu::BuildPermutation(act.ids.data(), rows, k, experts, permutation));
  TANDEM_RETURN_IF_ERROR(gpu::PermuteRows(act.norm2.data(), permutation, act.ffn_in.data(), d));
  TANDEM_RETURN_IF_ERROR(RunSwiGluMlp(layer, act.ffn_in.data(), permutation.offsets.data(), experts,
                                      rows * k, int64_t{ffn} * d, ffn, act,
                                      act.ffn_rows_out.data()));
  TANDEM_RETURN_IF_ERROR(gpu::ZeroDevice(out, int64_t{rows} * d * sizeof(float)));
  TANDEM_RETURN_IF_ERROR(
      gpu::UnpermuteAdd(act.ffn_rows_out.data(), permutation, act.gate_weights.data(), out, d));
  if (config_.num_shared_experts == 0) return absl::OkStatus();
  const int shared_ffn = config_.shared_expert_ffn_dim();
  TANDEM_RETURN_IF_ERROR(Linear(act.norm2.data(), prefix + "shared_experts.gate_proj.weight", rows,
                                d, shared_ffn, act.shared_gate.data()));
  TANDEM_RETURN_IF_ERROR(Linear(act.norm2.data(), prefix + "shared_experts.up_proj.weight", rows, d,
                                shared_ffn, act.shared_up.data()));
  const int64_t shared_hidden = int64_t{rows} * shared_ffn;
  TANDEM_RETURN_IF_ERROR(Round(act.shared_gate.data(), shared_hidden));
  TANDEM_RETURN_IF_ERROR(Round(act.shared_up.data(), shared_hidden));
  TANDEM_RETURN_IF_ERROR(gpu::SwiGlu(act.shared_gate.data(), act.shared_up.data(),
                                     act.shared_activation.data(), shared_hidden));
  TANDEM_RETURN_IF_ERROR(Round(act.shared_activation.data(), shared_hidden));
  return Linear(act.shared_activation.data(), prefix + "shared_experts.down_proj.weight", rows,
                shared_ffn, d, out, /*accumulate=*/true);
}

// Live top-k on the device. Without replay the routes stay there until the pass ends
// (CollectLiveRoutes), so the forward never waits on the host; with replay they come to the
// host now, where replayed rows replace live ones (and are compared with them) exactly as on
// the CPU, then go back.
absl::Status CudaTransformer::RouteLayer(int layer, Activations& act) {
  Pass& pass = *pass_;
  const int k = config_.top_k, layers = static_cast<int>(moe_layers_.size());
  const int moe_index = moe_index_[layer];
  const float* bias =
      base_->Find(absl::StrCat("model.layers.", layer, ".mlp.gate.e_score_correction_bias"));
  TANDEM_RETURN_IF_ERROR(gpu::TopK(act.scores.data(), bias, pass.rows, config_.num_experts, k,
                                   act.ids.data(),
                                   {config_.num_expert_groups, config_.kept_expert_groups}));
  if (pass.replay == nullptr) return absl::OkStatus();
  std::vector<int16_t> used(int64_t{pass.rows} * k);
  TANDEM_RETURN_IF_ERROR(
      gpu::CopyToHost(used.data(), act.ids.data(), used.size() * sizeof(int16_t)));
  for (int t = 0; t < pass.rows; ++t) {
    int16_t* row = used.data() + int64_t{t} * k;
    const int64_t at = (int64_t{t} * layers + moe_index) * k;
    std::copy_n(row, k, live_routes_.data() + at);
    const int16_t* given = pass.replay->data() + at;
    if (given[0] < 0) ++stats_.live_fallbacks;
    if (given[0] >= 0) {
      ++stats_.decisions;
      pass.token_replayed[t] = 1;
      if (!SameExpertSet(row, given, k)) {
        ++stats_.differing_decisions;
        pass.token_differs[t] = 1;
      }
      std::copy_n(given, k, row);
    }
    std::copy_n(row, k, routes_.data() + at);
  }
  return gpu::CopyToDevice(act.ids.data(), used.data(), used.size() * sizeof(int16_t));
}

// The live routes every MoE layer kept on the device, into routes_ and live_routes_.
absl::Status CudaTransformer::CollectLiveRoutes() {
  const int rows = pass_->rows, k = config_.top_k, layers = static_cast<int>(moe_layers_.size());
  std::vector<int16_t> layer_routes(int64_t{rows} * k);
  for (int moe_index = 0; moe_index < layers; ++moe_index) {
    const Activations& act = pass_->layers[moe_layers_[moe_index]];
    TANDEM_RETURN_IF_ERROR(gpu::CopyToHost(layer_routes.data(), act.ids.data(),
                                           layer_routes.size() * sizeof(int16_t)));
    for (int t = 0; t < rows; ++t) {
      const int64_t at = (int64_t{t} * layers + moe_index) * k;
      std::copy_n(layer_routes.data() + int64_t{t} * k, k, routes_.data() + at);
    }
  }
  live_routes_ = routes_;
  return absl::OkStatus();
}

absl::Status CudaTransformer::RunSwiGluMlp(int layer, const float* x, const int* offsets,
                                           int groups, int rows, int64_t weight_stride, int ffn,
                                           Activations& act, float* out) {
  const int d = config_.d_model;
  TANDEM_RETURN_IF_ERROR(Project(layer, "gate_proj", x, offsets, groups, rows, weight_stride, d,
                                 ffn, act.lora_gate.data(), act.gate.data()));
  TANDEM_RETURN_IF_ERROR(Project(layer, "up_proj", x, offsets, groups, rows, weight_stride, d, ffn,
                                 act.lora_up.data(), act.up.data()));
  const int64_t hidden = int64_t{rows} * ffn;
  TANDEM_RETURN_IF_ERROR(Round(act.gate.data(), hidden));
  TANDEM_RETURN_IF_ERROR(Round(act.up.data(), hidden));
  TANDEM_RETURN_IF_ERROR(
      gpu::SwiGlu(act.gate.data(), act.up.data(), act.activation.data(), hidden));
  TANDEM_RETURN_IF_ERROR(Round(act.activation.data(), hidden));
  TANDEM_RETURN_IF_ERROR(Project(layer, "down_proj", act.activation.data(), offsets, groups, rows,
                                 weight_stride, ffn, d, act.lora_down.data(), out));
  return Round(out, int64_t{rows} * d);
}

absl::Status CudaTransformer::Project(int layer, const char* module, const float* x,
                                      const int* offsets, int groups, int rows, int64_t w_stride,
                                      int in, int out, float* lora_h, float* y) {
  TANDEM_RETURN_IF_ERROR(MultiplyGroups(x, Weight(ProjectionName(config_, layer, module)), w_stride,
                                        offsets, groups, rows, in, out, y));
  const std::optional<LoraProjection> lora = DeviceLora(layer, module);
  if (!lora.has_value()) return absl::OkStatus();
  return gpu::GroupedLoraForward(x, offsets, groups, rows, in, out, lora->weights, lora_h, y);
}

absl::Status CudaTransformer::Linear(const float* x, const std::string& weight, int rows, int in,
                                     int out, float* y, bool accumulate) {
  return MultiplyGroups(x, Weight(weight), 0, pass_->dense_offsets.data(), 1, rows, in, out, y,
                        accumulate);
}

}  // namespace tandem::engine::cuda
