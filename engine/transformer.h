#ifndef TANDEM_ENGINE_TRANSFORMER_H_
#define TANDEM_ENGINE_TRANSFORMER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/bound_weights.h"
#include "engine/buffer.h"
#include "engine/decode_engine.h"
#include "engine/expert_exchange.h"
#include "engine/model.h"
#include "engine/model_ops.h"

namespace tandem::engine {

// Sequences packed back to back, without padding.
struct TokenBatch {
  std::vector<int> tokens;
  std::vector<int> sequence_starts = {0};  // Sequence s is [starts[s], starts[s+1]).

  void Add(const std::vector<int>& sequence);
  int num_tokens() const { return static_cast<int>(tokens.size()); }
  int num_sequences() const { return static_cast<int>(sequence_starts.size()) - 1; }
};

// How live routing compares with routes given for replay (R3): a decision is one
// token × MoE layer; it differs when the two top-k sets differ.
struct RoutingStats {
  int64_t decisions = 0;
  int64_t differing_decisions = 0;
  int64_t tokens = 0;
  int64_t differing_tokens = 0;
  int64_t live_fallbacks = 0;  // Rows given as -1, which were routed live.

  double decision_disagreement() const;
  double token_disagreement() const;
};

// Whether two routing rows of k distinct expert ids choose the same set (order aside): what
// counts as agreement between live and replayed routing.
bool SameExpertSet(const int16_t* a, const int16_t* b, int k);

// What a full-sequence forward accepts: sequences of 1..max_seq_len tokens in [0, vocab_size)
// and, with replay, routes of tokens × MoE layers × top_k ids, each row all -1 or k distinct
// experts. INVALID_ARGUMENT naming the first violation.
absl::Status CheckForwardInput(const ModelConfig& config, const TokenBatch& batch,
                               const std::vector<int16_t>* replay);

// Computes attention for the rows of one forward call. Training attends within each packed
// sequence; generation attends against a KV cache.
class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;
  // q, k, v: [rows, heads, head_dim] after RoPE; writes out [rows, heads, head_dim].
  virtual void Attend(int layer, Ref<const float> q, Ref<const float> k, Ref<const float> v,
                      Ref<float> out) = 0;
};

// The MoE transformer's forward and backward over a BaseModel and an optional LoRA adapter.
// Route arrays are [tokens, moe_layers, top_k] int16 logical expert ids, moe_layers in the
// order of ModelConfig::MoeLayerIndices().
class Transformer : public DecodeEngine {
 public:
  // model, lora and exchange are not owned; each must outlive this object. lora may be null.
  // `ops`, the backend the caller chose (CpuModelOps, CUDA's), computes everything; null
  // aborts. `exchange` moves each MoE layer's routed rows to the ranks computing their experts
  // and back (expert parallelism); null: every expert is computed here.
  Transformer(BaseModel& model, LoraAdapter* lora, std::unique_ptr<ModelOps> ops,
              Precision precision = Precision::kF32, ExpertExchange* exchange = nullptr);
  ~Transformer() override;

  // Full-sequence forward of a packed batch, keeping activations for Backward. With
  // `replay` (may be null: live routing) the given experts are used, -1 rows routed live;
  // gate weights are recomputed from this model's router logits over the given experts.
  // INVALID_ARGUMENT for bad tokens, sequences longer than max_seq_len, or invalid routes
  // (wrong size, ids out of range, duplicates in a row, a row mixing -1 and ids). Returns logits
  // [tokens, vocab], valid until the next call.
  absl::StatusOr<const float*> Forward(const TokenBatch& batch,
                                       const std::vector<int16_t>* replay = nullptr);

  // Forward without the whole-vocabulary logits, for training: the log-probability of token
  // targets[t] at each row t under softmax(logits[t] / temperature), 0 where targets[t] is -1
  // (nothing to score). The LM head runs by tiles of kHeadChunkRows rows × kHeadChunkColumns
  // vocabulary columns, folding each tile into the rows' log-sum-exps (ModelOps::FoldLogSumExp),
  // so that no more than one tile of logits exists at once whatever the vocabulary; with one
  // column chunk the result equals the whole logits' bit for bit. BackwardLogProbs computes the
  // tiles again. Forward's
  // errors, and INVALID_ARGUMENT for targets that are not one per row, each -1 or in
  // [0, vocab), or a temperature that is not positive and finite.
  absl::StatusOr<std::vector<float>> ForwardLogProbs(const TokenBatch& batch,
                                                     const std::vector<int16_t>* replay,
                                                     const std::vector<int>& targets,
                                                     float temperature);
  // Backpropagates dlogp [tokens] (the loss's gradient with respect to each log-probability
  // ForwardLogProbs returned; rows without a target are ignored) plus, if non-null, dhidden
  // (as Backward's) into every parameter whose gradients are enabled. FAILED_PRECONDITION unless
  // the last call was a ForwardLogProbs that succeeded.
  absl::Status BackwardLogProbs(const float* dlogp, const float* dhidden = nullptr);
  static constexpr int kHeadChunkRows = 128;
  static constexpr int kHeadChunkColumns = 8192;

  // Routes the last Forward used (replayed ones with fallbacks filled in by live routing).
  const std::vector<int16_t>& routes() const { return routes_; }
  // Routes live routing chose in the last Forward, before any replay replaced them.
  const std::vector<int16_t>& live_routes() const { return live_routes_; }
  // Live routing against the replayed routes in the last Forward; zeros without replay.
  const RoutingStats& routing_stats() const { return stats_; }

  // The final normalized hidden states [tokens, d_model] of the last Forward, which the LM head
  // reads: the input of a head outside the model, such as PPO's value head.
  const std::vector<float>& final_hidden() const { return final_hidden_; }

  // Backpropagates dlogits [tokens, vocab] of the last Forward, plus, if non-null, dhidden
  // [tokens, d_model] (the gradient of a head outside the model with respect to
  // final_hidden()), into every parameter whose gradients are enabled
  // (ParameterSet::EnableGradients), accumulating. FAILED_PRECONDITION unless the last call was
  // a Forward that succeeded; otherwise fails only when the expert exchange or the operations'
  // backend does.
  absl::Status Backward(const float* dlogits, const float* dhidden = nullptr);

  // One forward over arbitrary rows (token, absolute position) with a caller's attention;
  // what generation builds on. Writes the logits of `logit_rows` (ascending row indices; empty:
  // every row) [logit rows, vocab] and, if non-null, the routes used [rows, moe_layers, top_k].
  // Activations are not kept. INVALID_ARGUMENT for logit rows that do not ascend within
  // [0, rows); otherwise fails only when the expert exchange or the operations' backend does.
  absl::Status ForwardRows(const int* tokens, const int* positions, int rows,
                           AttentionBackend& attention, float* logits, int16_t* routes_out,
                           absl::Span<const int> logit_rows = {});

  const ModelConfig& config() const override { return config_; }

  // The adapter's host values changed (an optimizer step, a load): the next pass computes with
  // them (a device backend copies them again; the CPU one reads them in place).
  absl::Status AdapterChanged() { return ops_->AdapterChanged(); }

  // DecodeEngine, with caches in host memory (transformer_decode.cc): the prompt attends
  // causally within itself, each decoded token over its sequence's cache.
  absl::StatusOr<std::unique_ptr<SequenceCache>> NewCache(int positions) override;
  // On the host, prompts one by one, so a prompt's numbers never depend on the others in its
  // batch; on a device all in one pass (hundreds of small passes would leave it idle), where they
  // may, slightly. INVALID_ARGUMENT for an empty prompt or one longer than its cache.
  absl::Status Prefill(const std::vector<PromptToPrefill>& prompts, float* last_logits,
                       int16_t* routes) override;
  absl::Status Decode(const int* tokens, const int* positions,
                      const std::vector<SequenceCache*>& caches, float* logits,
                      int16_t* routes) override;

 private:
  struct LayerActivations;

  // Embedding and layers over token_buffer_ and position_buffer_, into final_input_.
  absl::Status RunLayers(int rows, AttentionBackend& attention, const int16_t* replay);
  absl::Status RunLayer(int layer, int rows, AttentionBackend& attention, const int16_t* replay,
                        LayerActivations& act);
  // Queries, keys and values of a layer in the attention kernels' layout (act.q, act.k, act.v),
  // roped, from act.norm1; and back: dq, dk, dv (consumed) into dnorm1 and the weights' and
  // LoRA's gradients. Standard grouped-query attention here; DeepSeek's latent attention in
  // transformer_latent.cc.
  void RunStandardProjections(int layer, int rows, LayerActivations& act);
  void BackwardStandardProjections(int layer, LayerActivations& act, Buffer<float>& dq,
                                   Buffer<float>& dk, const Buffer<float>& dv, Ref<float> dnorm1);
  void RunLatentProjections(int layer, int rows, LayerActivations& act);
  void BackwardLatentProjections(int layer, LayerActivations& act, Buffer<float>& dq,
                                 Buffer<float>& dk, const Buffer<float>& dv, Ref<float> dnorm1);
  // RMSNorm of a q or k projection x ([rows, heads * head_dim]) in place, as config's qk_norm
  // says; keeps the input in `raw` and the reciprocal RMS in `rstd` for the backward.
  void NormalizeQk(const std::string& weight, int rows, int heads, Buffer<float>& x,
                   Buffer<float>& raw, Buffer<float>& rstd);
  // Turns dx, the gradient of the normalized projection, into that of the raw one.
  void NormalizeQkBackward(const std::string& weight, int heads, const Buffer<float>& raw,
                           const Buffer<float>& rstd, Buffer<float>& dx);
  void RunDenseFfn(int layer, int rows, LayerActivations& act);
  // The MoE block (transformer_moe.cc): route -> permute -> dispatch -> experts -> combine ->
  // unpermute and gate, plus the shared experts; act.ffn_out gets the block's output.
  absl::Status RunMoeFfn(int layer, int moe_index, int rows, const int16_t* replay,
                         LayerActivations& act);
  // Router, top-k, replay of given routes (recording live and used routes and the disagreement),
  // gate weights.
  void RouteTokens(int layer, int moe_index, int rows, const int16_t* replay,
                   LayerActivations& act);
  // Adds the shared experts' output to act.ffn_out.
  void RunSharedExperts(int layer, int rows, LayerActivations& act);
  // Where a MoE block's first local expert sits in the stacked tensors this rank holds: the base
  // model's and the adapter's (either may hold all experts or only the local ones).
  struct ExpertSlots {
    int base = 0;
    int lora = 0;
  };
  // FAILED_PRECONDITION unless the model and the adapter hold every local expert of `layer`.
  absl::StatusOr<ExpertSlots> LocalExpertSlots(int layer);
  // down(silu(gate(x)) * up(x)) over act.group_offsets' row groups (group g uses the weights at
  // (first.base + g) * weight_stride and the LoRA's of group first.lora + g: one dense MLP with
  // stride 0, or one expert per group); keeps gate, up and activation in `act` for the backward
  // pass and writes `out` ([rows, d_model]).
  void RunSwiGluMlp(int layer, Ref<const float> x, int64_t weight_stride, int ffn,
                    ExpertSlots first, LayerActivations& act, Buffer<float>& out);
  // Backward of RunSwiGluMlp: dx += ∂L/∂x, weight and LoRA gradients accumulated.
  void BackwardSwiGluMlp(int layer, Ref<const float> x, int64_t weight_stride, int ffn,
                         ExpertSlots first, LayerActivations& act, Ref<const float> dy,
                         Ref<float> dx);
  void RunHead(int rows);  // From final_input_.
  void RunFinalNorm(int rows);
  // The LM head's logits of final_norm_'s rows [first_row, first_row + rows) for vocabulary
  // columns [first_column, first_column + columns), divided by temperature, into logits_.
  void RunHeadTile(int first_row, int rows, int first_column, int columns, float temperature);
  // Calls `tile(first_row, rows, first_column, columns)` for each tile of the LM head over
  // `rows` rows (kHeadChunkRows × kHeadChunkColumns), rows outermost.
  void ForEachHeadTile(int rows, absl::FunctionRef<void(int, int, int, int)> tile) const;
  // The full-sequence forward's trunk, up to final_input_: Forward's and ForwardLogProbs'.
  absl::Status ForwardTrunk(const TokenBatch& batch, const std::vector<int16_t>* replay);
  // Backward from dnorm, the gradient of the final norm's output ([tokens, d_model], consumed).
  absl::Status BackwardFromFinalNorm(Buffer<float>& dnorm);
  // What the last pass was: a Forward or ForwardLogProbs that succeeded can be backpropagated.
  enum class Ready { kNone, kLogits, kLogProbs };
  // OK when the last pass was a `pass` that succeeded (else FAILED_PRECONDITION `missing`) and the
  // backend computes every gradient enabled (else UNIMPLEMENTED: base weights frozen there).
  absl::Status ReadyForBackward(Ready pass, const char* missing) const;
  // Moves final_input_'s rows `kept` (ascending) to its front, so that the head runs on them
  // alone: a prefill needs the logits of each prompt's last row only.
  void KeepFinalRows(absl::Span<const int> kept);
  absl::Status BackwardLayer(int layer, Ref<float> dx);
  void BackwardDenseFfn(int layer, Ref<const float> dy, Ref<float> dn2);
  absl::Status BackwardMoeFfn(int layer, Ref<const float> dy, Ref<float> dn2);
  void BackwardSharedExperts(int layer, int rows, Ref<const float> dy, Ref<float> dn2);
  // Ends a pass that failed with `status`: the backend's Finish runs anyway (so its state does
  // not leak into the next pass); returns `status`, or Finish's error if `status` is OK.
  absl::Status Finished(absl::Status status);
  void Round(Ref<float> values, int64_t count) const;
  // The input of FP8 linear layers: quantized per row (token) in FP8 mode, as is otherwise.
  void QuantizeInput(Ref<float> values, int64_t rows, int64_t width) const;
  // The bound weight `name` (weights_).
  WeightRef Weight(const std::string& name) const;
  // A projection's LoRA, its groups (experts) counted from `first_group`.
  std::optional<LoraProjection> Lora(int layer, absl::string_view module,
                                     int first_group = 0) const;

  ModelConfig config_;
  BaseModel& model_;
  LoraAdapter* lora_;
  Precision precision_;
  const std::unique_ptr<AllExpertsLocal> all_experts_local_;  // When no exchange is given.
  ExpertExchange* const exchange_;
  std::vector<int> moe_layers_;
  std::vector<int> moe_index_;  // Per layer: its index among the MoE layers, -1 if dense.
  // What every computation goes through; const methods emulate precision.
  const std::unique_ptr<ModelOps> ops_;
  // The model's and adapter's weights bound to ops_, refreshed at the start of every pass.
  BoundWeights weights_;

  // State of the last Forward: host metadata, the backend's activations, host copies of what
  // callers read.
  std::vector<int> tokens_;
  std::vector<int> positions_;
  std::vector<int> sequence_starts_;
  Buffer<int> token_buffer_, position_buffer_;
  std::vector<LayerActivations> layers_;
  Buffer<float> final_input_, final_norm_, final_rstd_, logits_;
  std::vector<Buffer<float>> attention_probs_;  // Per layer, per sequence [H, T, T].
  std::vector<float> final_hidden_, logits_on_host_;
  std::vector<int16_t> routes_, live_routes_;
  RoutingStats stats_;
  std::vector<uint8_t> token_replayed_, token_differs_;  // Per token, for RoutingStats.
  Ready backward_ready_ = Ready::kNone;
  // ForwardLogProbs' targets on the backend (-1 as 0) and on the host, each row's log-sum-exp
  // of logits / temperature, and temperature.
  Buffer<int> target_buffer_;
  Buffer<float> log_sum_exps_;
  std::vector<int> targets_;
  float temperature_ = 1.0f;
};

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_TRANSFORMER_H_
