#include "engine/cuda/cuda_transformer.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/grouped_lora.h"
#include "kernels/cuda/permute.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/router.h"
#include "kernels/cuda/swiglu.h"

// Every step below is a kernel launch or copy that may fail; the first failure ends the pass.
#define TANDEM_RETURN_IF_ERROR(expr)                    \
  do {                                                  \
    if (absl::Status _status = (expr); !_status.ok()) { \
      return _status;                                   \
    }                                                   \
  } while (false)

namespace tandem::engine::cuda {

namespace gpu = ::tandem::cuda;
using gpu::DeviceArray;

// One Forward: its inputs, the routing bookkeeping, and device buffers sized for its rows
// (reused by every layer; the largest width any layer needs).
struct CudaTransformer::Pass {
  int rows = 0;
  std::vector<int> sequence_starts;
  const std::vector<int16_t>* replay = nullptr;
  std::vector<uint8_t> token_replayed, token_differs;

  DeviceArray<int> tokens, positions, dense_offsets;
  DeviceArray<float> x, norm, q, q_raw, k, k_raw, v, attention, projected, probs;
  DeviceArray<float> gate, up, activation, ffn_in, ffn_rows_out, ffn_out, lora_h;
  DeviceArray<float> router_logits, scores, gate_weights, final_norm, logits;
  DeviceArray<int16_t> ids;
  std::optional<gpu::DevicePermutation> permutation;
};

namespace {

// The widest hidden layer of any MLP, per routed row: dense FFN, expert FFN or shared experts.
int64_t MaxFfnWidth(const ModelConfig& config) {
  return std::max({config.dense_ffn_dim, config.expert_ffn_dim, config.shared_expert_ffn_dim()});
}

int MaxSequenceLength(const std::vector<int>& starts) {
  int longest = 0;
  for (size_t s = 0; s + 1 < starts.size(); ++s)
    longest = std::max(longest, starts[s + 1] - starts[s]);
  return longest;
}

template <typename T>
absl::Status Allocate(DeviceArray<T>& array, int64_t size) {
  absl::StatusOr<DeviceArray<T>> allocated = DeviceArray<T>::Zeros(std::max<int64_t>(size, 1));
  if (!allocated.ok()) return allocated.status();
  array = *std::move(allocated);
  return absl::OkStatus();
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
                                                                         int device) {
  if (model.config().latent_attention()) {
    return absl::UnimplementedError("latent attention does not run on CUDA yet");
  }
  if (absl::Status status = gpu::SelectDevice(device).status(); !status.ok()) return status;
  absl::StatusOr<DeviceParameters> base = DeviceParameters::Upload(model.parameters());
  if (!base.ok()) return base.status();
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
      new CudaTransformer(model, lora, *std::move(base), std::move(adapter), *std::move(rope)));
}

CudaTransformer::CudaTransformer(const BaseModel& model, LoraAdapter* lora, DeviceParameters base,
                                 std::unique_ptr<DeviceParameters> adapter,
                                 gpu::DeviceRopeFrequencies rope)
    : config_(model.config()),
      model_(model),
      lora_(lora),
      base_(std::move(base)),
      adapter_(std::move(adapter)),
      rope_(std::move(rope)),
      moe_layers_(config_.MoeLayerIndices()),
      moe_index_(config_.num_layers, -1) {
  for (size_t m = 0; m < moe_layers_.size(); ++m) moe_index_[moe_layers_[m]] = static_cast<int>(m);
}

absl::Status CudaTransformer::RefreshAdapter() {
  if (lora_ == nullptr) return absl::OkStatus();
  return adapter_->Refresh(lora_->parameters());
}

const float* CudaTransformer::Weight(const std::string& name) const { return base_.Find(name); }

absl::StatusOr<const float*> CudaTransformer::Forward(const TokenBatch& batch,
                                                      const std::vector<int16_t>* replay) {
  TANDEM_RETURN_IF_ERROR(CheckForwardInput(config_, batch, replay));
  Pass pass;
  pass.rows = batch.num_tokens();
  pass.sequence_starts = batch.sequence_starts;
  pass.replay = replay;
  pass.token_replayed.assign(pass.rows, 0);
  pass.token_differs.assign(pass.rows, 0);
  std::vector<int> positions(pass.rows);
  for (int s = 0; s < batch.num_sequences(); ++s) {
    for (int t = batch.sequence_starts[s]; t < batch.sequence_starts[s + 1]; ++t) {
      positions[t] = t - batch.sequence_starts[s];
    }
  }
  const int64_t rows = pass.rows, d = config_.d_model, k = config_.top_k;
  const int64_t routed = rows * std::max(1, config_.top_k);
  const int64_t rank = lora_ == nullptr ? 1 : lora_->config().rank;
  const int64_t longest = MaxSequenceLength(batch.sequence_starts);
  TANDEM_RETURN_IF_ERROR(Upload(pass.tokens, batch.tokens));
  TANDEM_RETURN_IF_ERROR(Upload(pass.positions, positions));
  TANDEM_RETURN_IF_ERROR(Upload(pass.dense_offsets, std::vector<int>{0, pass.rows}));
  const std::pair<DeviceArray<float> Pass::*, int64_t> buffers[] = {
      {&Pass::x, rows * d},
      {&Pass::norm, rows * d},
      {&Pass::q, rows * config_.query_width()},
      {&Pass::q_raw, rows * config_.query_width()},
      {&Pass::k, rows * config_.key_width()},
      {&Pass::k_raw, rows * config_.key_width()},
      {&Pass::v, rows * config_.value_width()},
      {&Pass::attention, rows * config_.attention_out_dim()},
      {&Pass::projected, rows * d},
      {&Pass::probs, int64_t{config_.num_heads} * longest * longest},
      {&Pass::gate, routed * MaxFfnWidth(config_)},
      {&Pass::up, routed * MaxFfnWidth(config_)},
      {&Pass::activation, routed * MaxFfnWidth(config_)},
      {&Pass::ffn_in, routed * d},
      {&Pass::ffn_rows_out, routed * d},
      {&Pass::ffn_out, rows * d},
      {&Pass::lora_h, routed * rank},
      {&Pass::router_logits, rows * config_.num_experts},
      {&Pass::scores, rows * config_.num_experts},
      {&Pass::gate_weights, rows * k},
      {&Pass::final_norm, rows * d},
      {&Pass::logits, rows * config_.vocab_size},
  };
  for (const auto& [buffer, size] : buffers) TANDEM_RETURN_IF_ERROR(Allocate(pass.*buffer, size));
  TANDEM_RETURN_IF_ERROR(Allocate(pass.ids, rows * k));
  if (!moe_layers_.empty()) {
    absl::StatusOr<gpu::DevicePermutation> permutation =
        gpu::DevicePermutation::Allocate(pass.rows, config_.top_k, config_.num_experts);
    if (!permutation.ok()) return permutation.status();
    pass.permutation = *std::move(permutation);
  }

  stats_ = RoutingStats{};
  routes_.assign(rows * moe_layers_.size() * k, -1);
  live_routes_.assign(routes_.size(), -1);
  TANDEM_RETURN_IF_ERROR(gpu::EmbeddingGather(Weight("model.embed_tokens.weight"),
                                              pass.tokens.data(), pass.x.data(), pass.rows,
                                              config_.d_model));
  for (int layer = 0; layer < config_.num_layers; ++layer) {
    TANDEM_RETURN_IF_ERROR(RunLayer(layer, pass));
  }
  TANDEM_RETURN_IF_ERROR(gpu::RmsNorm(pass.x.data(), Weight("model.norm.weight"),
                                      pass.final_norm.data(), nullptr, pass.rows, config_.d_model,
                                      config_.norm_eps));
  TANDEM_RETURN_IF_ERROR(Linear(pass.final_norm.data(), HeadWeightName(config_), pass.rows,
                                config_.d_model, config_.vocab_size, pass, pass.logits.data()));
  logits_.resize(rows * config_.vocab_size);
  TANDEM_RETURN_IF_ERROR(
      gpu::CopyToHost(logits_.data(), pass.logits.data(), logits_.size() * sizeof(float)));
  for (int t = 0; t < pass.rows; ++t) {
    stats_.tokens += pass.token_replayed[t];
    stats_.differing_tokens += pass.token_differs[t];
  }
  return logits_.data();
}

absl::Status CudaTransformer::RunLayer(int layer, Pass& pass) {
  const int64_t n = int64_t{pass.rows} * config_.d_model;
  const std::string prefix = absl::StrCat("model.layers.", layer, ".");
  TANDEM_RETURN_IF_ERROR(gpu::RmsNorm(pass.x.data(), Weight(prefix + "input_layernorm.weight"),
                                      pass.norm.data(), nullptr, pass.rows, config_.d_model,
                                      config_.norm_eps));
  TANDEM_RETURN_IF_ERROR(RunAttention(layer, pass));
  // Residual: x += o_proj(attention).
  TANDEM_RETURN_IF_ERROR(Project(layer, "o_proj", pass.attention.data(), pass.dense_offsets.data(),
                                 1, pass.rows, 0, config_.attention_out_dim(), config_.d_model,
                                 pass, pass.projected.data()));
  TANDEM_RETURN_IF_ERROR(gpu::AddInPlace(pass.projected.data(), pass.x.data(), n));
  TANDEM_RETURN_IF_ERROR(
      gpu::RmsNorm(pass.x.data(), Weight(prefix + "post_attention_layernorm.weight"),
                   pass.norm.data(), nullptr, pass.rows, config_.d_model, config_.norm_eps));
  if (moe_index_[layer] >= 0) {
    TANDEM_RETURN_IF_ERROR(RunMoeFfn(layer, pass));
  } else {
    TANDEM_RETURN_IF_ERROR(RunSwiGluMlp(layer, pass.norm.data(), pass.dense_offsets.data(), 1,
                                        pass.rows, 0, config_.dense_ffn_dim, pass,
                                        pass.ffn_out.data()));
  }
  return gpu::AddInPlace(pass.ffn_out.data(), pass.x.data(), n);  // Residual: x += FFN.
}

absl::Status CudaTransformer::RunAttention(int layer, Pass& pass) {
  const std::string prefix = absl::StrCat("model.layers.", layer, ".");
  const int* one_group = pass.dense_offsets.data();
  const bool normalized = config_.qk_norm != QkNorm::kNone;
  // With q/k norms the projections land in *_raw and the norms write q and k.
  float* q = normalized ? pass.q_raw.data() : pass.q.data();
  float* k = normalized ? pass.k_raw.data() : pass.k.data();
  TANDEM_RETURN_IF_ERROR(Project(layer, "q_proj", pass.norm.data(), one_group, 1, pass.rows, 0,
                                 config_.d_model, config_.q_dim(), pass, q));
  TANDEM_RETURN_IF_ERROR(Project(layer, "k_proj", pass.norm.data(), one_group, 1, pass.rows, 0,
                                 config_.d_model, config_.kv_dim(), pass, k));
  TANDEM_RETURN_IF_ERROR(Project(layer, "v_proj", pass.norm.data(), one_group, 1, pass.rows, 0,
                                 config_.d_model, config_.kv_dim(), pass, pass.v.data()));
  if (normalized) {
    TANDEM_RETURN_IF_ERROR(NormalizeQk(prefix + "self_attn.q_norm.weight", config_.num_heads,
                                       pass.q_raw.data(), pass.rows, pass.q.data()));
    TANDEM_RETURN_IF_ERROR(NormalizeQk(prefix + "self_attn.k_norm.weight", config_.kv_heads(),
                                       pass.k_raw.data(), pass.rows, pass.k.data()));
  }
  TANDEM_RETURN_IF_ERROR(
      gpu::Rope(pass.q.data(), pass.positions.data(), pass.rows, config_.num_heads, rope_));
  TANDEM_RETURN_IF_ERROR(
      gpu::Rope(pass.k.data(), pass.positions.data(), pass.rows, config_.kv_heads(), rope_));
  // Each packed sequence attends within itself.
  const cpu::AttentionShape shape = config_.attention_shape();
  const int64_t q_width = config_.query_width(), k_width = config_.key_width();
  const int64_t v_width = config_.value_width(), out_width = config_.attention_out_dim();
  for (size_t s = 0; s + 1 < pass.sequence_starts.size(); ++s) {
    const int64_t begin = pass.sequence_starts[s];
    const int length = pass.sequence_starts[s + 1] - pass.sequence_starts[s];
    TANDEM_RETURN_IF_ERROR(gpu::CausalAttention(
        pass.q.data() + begin * q_width, pass.k.data() + begin * k_width,
        pass.v.data() + begin * v_width, pass.attention.data() + begin * out_width,
        pass.probs.data(), length, shape));
  }
  return absl::OkStatus();
}

// The q/k norm over each head (kPerHead) or over the whole projection.
absl::Status CudaTransformer::NormalizeQk(const std::string& weight, int heads, const float* raw,
                                          int rows, float* out) {
  const bool per_head = config_.qk_norm == QkNorm::kPerHead;
  const int norm_rows = per_head ? rows * heads : rows;
  const int width = per_head ? config_.head_dim() : heads * config_.head_dim();
  return gpu::RmsNorm(raw, Weight(weight), out, nullptr, norm_rows, width, config_.norm_eps);
}

absl::Status CudaTransformer::RunMoeFfn(int layer, Pass& pass) {
  const int d = config_.d_model, experts = config_.num_experts, k = config_.top_k;
  const int ffn = config_.expert_ffn_dim;
  const std::string prefix = absl::StrCat("model.layers.", layer, ".mlp.");
  TANDEM_RETURN_IF_ERROR(Linear(pass.norm.data(), prefix + "gate.weight", pass.rows, d, experts,
                                pass, pass.router_logits.data()));
  TANDEM_RETURN_IF_ERROR(gpu::RouterScores(pass.router_logits.data(), pass.scores.data(), pass.rows,
                                           experts, config_.scoring));
  TANDEM_RETURN_IF_ERROR(RouteLayer(moe_index_[layer], pass.scores.data(),
                                    base_.Find(prefix + "gate.e_score_correction_bias"), pass,
                                    pass.ids.data()));
  TANDEM_RETURN_IF_ERROR(gpu::GateWeights(pass.scores.data(), pass.ids.data(), pass.rows, experts,
                                          k, config_.norm_topk_prob, pass.gate_weights.data()));
  TANDEM_RETURN_IF_ERROR(gpu::ScaleInPlace(pass.gate_weights.data(), config_.routed_scaling_factor,
                                           int64_t{pass.rows} * k));
  gpu::DevicePermutation& permutation = *pass.permutation;
  TANDEM_RETURN_IF_ERROR(
      gpu::BuildPermutation(pass.ids.data(), pass.rows, k, experts, permutation));
  TANDEM_RETURN_IF_ERROR(gpu::PermuteRows(pass.norm.data(), permutation, pass.ffn_in.data(), d));
  TANDEM_RETURN_IF_ERROR(RunSwiGluMlp(layer, pass.ffn_in.data(), permutation.offsets.data(),
                                      experts, pass.rows * k, int64_t{ffn} * d, ffn, pass,
                                      pass.ffn_rows_out.data()));
  TANDEM_RETURN_IF_ERROR(
      gpu::ZeroDevice(pass.ffn_out.data(), int64_t{pass.rows} * d * sizeof(float)));
  TANDEM_RETURN_IF_ERROR(gpu::UnpermuteAdd(pass.ffn_rows_out.data(), permutation,
                                           pass.gate_weights.data(), pass.ffn_out.data(), d));
  if (config_.num_shared_experts == 0) return absl::OkStatus();
  const int shared_ffn = config_.shared_expert_ffn_dim();
  const int64_t shared_hidden = int64_t{pass.rows} * shared_ffn;
  TANDEM_RETURN_IF_ERROR(Linear(pass.norm.data(), prefix + "shared_experts.gate_proj.weight",
                                pass.rows, d, shared_ffn, pass, pass.gate.data()));
  TANDEM_RETURN_IF_ERROR(Linear(pass.norm.data(), prefix + "shared_experts.up_proj.weight",
                                pass.rows, d, shared_ffn, pass, pass.up.data()));
  TANDEM_RETURN_IF_ERROR(
      gpu::SwiGlu(pass.gate.data(), pass.up.data(), pass.activation.data(), shared_hidden));
  return Linear(pass.activation.data(), prefix + "shared_experts.down_proj.weight", pass.rows,
                shared_ffn, d, pass, pass.ffn_out.data(), /*accumulate=*/true);
}

// Live top-k on the device; the routes come to the host once per layer, where replayed rows
// replace live ones (and are compared with them) exactly as on the CPU, then go back.
absl::Status CudaTransformer::RouteLayer(int moe_index, const float* scores, const float* bias,
                                         Pass& pass, int16_t* ids) {
  const int k = config_.top_k, layers = static_cast<int>(moe_layers_.size());
  TANDEM_RETURN_IF_ERROR(gpu::TopK(scores, bias, pass.rows, config_.num_experts, k, ids,
                                   {config_.num_expert_groups, config_.kept_expert_groups}));
  std::vector<int16_t> used(int64_t{pass.rows} * k);
  TANDEM_RETURN_IF_ERROR(gpu::CopyToHost(used.data(), ids, used.size() * sizeof(int16_t)));
  for (int t = 0; t < pass.rows; ++t) {
    int16_t* row = used.data() + int64_t{t} * k;
    const int64_t at = (int64_t{t} * layers + moe_index) * k;
    std::copy_n(row, k, live_routes_.data() + at);
    const int16_t* given = pass.replay == nullptr ? nullptr : pass.replay->data() + at;
    if (given != nullptr && given[0] < 0) ++stats_.live_fallbacks;
    if (given != nullptr && given[0] >= 0) {
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
  if (pass.replay == nullptr) return absl::OkStatus();
  return gpu::CopyToDevice(ids, used.data(), used.size() * sizeof(int16_t));
}

absl::Status CudaTransformer::RunSwiGluMlp(int layer, const float* x, const int* offsets,
                                           int groups, int rows, int64_t weight_stride, int ffn,
                                           Pass& pass, float* out) {
  const int d = config_.d_model;
  TANDEM_RETURN_IF_ERROR(Project(layer, "gate_proj", x, offsets, groups, rows, weight_stride, d,
                                 ffn, pass, pass.gate.data()));
  TANDEM_RETURN_IF_ERROR(Project(layer, "up_proj", x, offsets, groups, rows, weight_stride, d, ffn,
                                 pass, pass.up.data()));
  TANDEM_RETURN_IF_ERROR(
      gpu::SwiGlu(pass.gate.data(), pass.up.data(), pass.activation.data(), int64_t{rows} * ffn));
  return Project(layer, "down_proj", pass.activation.data(), offsets, groups, rows, weight_stride,
                 ffn, d, pass, out);
}

absl::Status CudaTransformer::Project(int layer, const char* module, const float* x,
                                      const int* offsets, int groups, int rows, int64_t w_stride,
                                      int in, int out, Pass& pass, float* y) {
  const gpu::RowGroupedGemm gemm{.a = x,
                                 .lda = in,
                                 .w = Weight(ProjectionName(config_, layer, module)),
                                 .w_group_stride = w_stride,
                                 .ldw = in,
                                 .transpose_w = true,
                                 .c = y,
                                 .ldc = out,
                                 .n = out,
                                 .k = in};
  TANDEM_RETURN_IF_ERROR(gpu::GroupedGemm(gemm, offsets, groups, rows));
  if (lora_ == nullptr) return absl::OkStatus();
  std::optional<LoraProjection> projection = lora_->Projection(layer, module);
  if (!projection.has_value()) return absl::OkStatus();
  cpu::GroupedLoraWeights weights = projection->weights;  // Host pointers, translated below.
  weights.a = adapter_->Translate(lora_->parameters(), weights.a);
  weights.b = adapter_->Translate(lora_->parameters(), weights.b);
  return gpu::GroupedLoraForward(x, offsets, groups, rows, in, out, weights, pass.lora_h.data(), y);
}

absl::Status CudaTransformer::Linear(const float* x, const std::string& weight, int rows, int in,
                                     int out, Pass& pass, float* y, bool accumulate) {
  const gpu::RowGroupedGemm gemm{.a = x,
                                 .lda = in,
                                 .w = Weight(weight),
                                 .w_group_stride = 0,
                                 .ldw = in,
                                 .transpose_w = true,
                                 .c = y,
                                 .ldc = out,
                                 .n = out,
                                 .k = in,
                                 .beta = accumulate ? 1.0f : 0.0f};
  return gpu::GroupedGemm(gemm, pass.dense_offsets.data(), 1, rows);
}

}  // namespace tandem::engine::cuda

#undef TANDEM_RETURN_IF_ERROR
