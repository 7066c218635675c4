#ifndef TANDEM_ENGINE_MODEL_OPS_H_
#define TANDEM_ENGINE_MODEL_OPS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "engine/buffer.h"
#include "engine/model.h"
#include "engine/weight.h"
#include "kernels/types.h"

namespace tandem::engine {

// How BuildPermutation grouped one MoE layer's routed rows (rows × k slots) by expert: the
// offsets on the host, where the expert exchange and the grouped projections plan with them; the
// rest in the backend's own form (the CPU's cpu::ExpertPermutation, a device's arrays).
struct ExpertPermutation {
  std::vector<int> offsets;  // [experts + 1]: expert e's rows are [offsets[e], offsets[e + 1]).
  int rows = 0;
  int k = 0;
  std::shared_ptr<const void> state;
};

// What a backend can do, declared up front so that callers check it once, before the first pass.
struct BackendCapabilities {
  // Code outside the operations (an expert exchange over Gloo) may read and write the buffers'
  // memory through their addresses between calls: host memory.
  bool host_memory = false;
  // The weight formats Bind accepts.
  std::vector<WeightFormat> weight_formats;
  // Whether a backward computes the base model's weight gradients (full fine-tuning), not only
  // the adapter's.
  bool base_gradients = false;

  bool Accepts(WeightFormat format) const;
};

// One LoRA-adapted projection, bound: A [.., rank, in] and B [.., out, rank], and how row groups
// (experts) step through them (LoraAdapter::ProjectionLayout).
struct LoraProjection {
  WeightRef a;
  WeightRef b;
  int64_t a_group_stride = 0;  // Elements between consecutive groups' A; 0: one A for all.
  int64_t b_group_stride = 0;
  int rank = 0;
  float scale = 0;  // alpha / rank.

  // The projection with its groups counted from `first_group`.
  LoraProjection FromGroup(int first_group) const;
};

// Every computation the transformer's graph makes, so that one graph runs over whichever backend
// implements them (the CPU kernels, CUDA's). Activations live in the backend's memory and reach
// the operations as Refs, which the graph cannot read; weights are bound to the backend once
// (Bind: the CPU uses the host parameters in place, CUDA their device copies) and reach the
// operations as WeightRefs, each with its format and, when it trains, its gradient. Arrays are
// row-major float32 unless named otherwise; "+=" marks outputs that accumulate, and a backward
// accumulates into the gradient of each weight that trains.
class ModelOps {
 public:
  virtual ~ModelOps() = default;

  virtual const BackendCapabilities& capabilities() const = 0;
  // `weight` in this backend's memory, for every pass until its host storage moves (a
  // reallocation, such as an expert move): the caller binds it again then. INVALID_ARGUMENT for a
  // format capabilities() does not accept; a backend that mirrors weights refuses one it does
  // not hold (FAILED_PRECONDITION). Base-model gradients without capabilities().base_gradients
  // are dropped: the caller checks before a backward.
  virtual absl::StatusOr<WeightRef> Bind(const HostWeight& weight) = 0;

  // Ends a forward, backward or decode: the first error any operation since the last Finish met
  // (operations return nothing: a device backend learns of failures late), with the results the
  // graph's caller reads (host gradients) in place. The CPU backend cannot fail.
  virtual absl::Status Finish() = 0;
  // The adapter's host values changed (an optimizer step, a load): a backend that mirrors them
  // (CUDA's device copy) copies them again before the next pass.
  virtual absl::Status AdapterChanged() { return absl::OkStatus(); }

  // Memory. Resize keeps the contents only when the buffer does not grow. The graph reads results
  // on the host only through CopyOut (routes, logits, hidden states).
  template <typename T>
  void Resize(Buffer<T>& buffer, int64_t size);
  template <typename T>
  Buffer<T> Allocate(int64_t size) {
    Buffer<T> buffer;
    Resize(buffer, size);
    return buffer;
  }
  Buffer<float> Zeros(int64_t size) {
    Buffer<float> buffer = Allocate<float>(size);
    Fill(buffer.ref(), 0.0f, size);
    return buffer;
  }
  template <typename T>
  void Upload(const T* host, int64_t count, Buffer<T>& buffer) {
    Resize(buffer, count);
    CopyIn(host, buffer.ref(), count);
  }
  virtual void Copy(Ref<const float> source, Ref<float> target, int64_t count) = 0;
  virtual void Fill(Ref<float> target, float value, int64_t count) = 0;

  // Projections. y = x·Wᵀ (y += x·Wᵀ with `accumulate`), x [rows, in], W [out, in].
  virtual void Linear(Ref<const float> x, WeightRef w, Ref<float> y, int rows, int in, int out,
                      bool accumulate) = 0;
  // dx += dy·W; dW += dyᵀ·x.
  virtual void LinearBackward(Ref<const float> x, WeightRef w, Ref<const float> dy, Ref<float> dx,
                              int rows, int in, int out) = 0;
  // y = x_g·W_gᵀ per row group g of `offsets` (W_g at g·w_stride: one dense projection with
  // stride 0, or one expert per group), plus the LoRA's contribution; lora_h keeps x·Aᵀ.
  virtual void ProjectGroups(Ref<const float> x, const std::vector<int>& offsets, WeightRef w,
                             int64_t w_stride, int in, int out,
                             const std::optional<LoraProjection>& lora, Buffer<float>& lora_h,
                             Ref<float> y) = 0;
  // Backward of ProjectGroups: dx += dy·W_g; dW_g += dyᵀ·x; LoRA gradients +=.
  virtual void ProjectGroupsBackward(Ref<const float> x, const std::vector<int>& offsets,
                                     WeightRef w, int64_t w_stride, int in, int out,
                                     const std::optional<LoraProjection>& lora,
                                     Ref<const float> lora_h, Ref<const float> dy,
                                     Ref<float> dx) = 0;

  // RMSNorm of `rows` rows of `width`; rstd [rows] kept for the backward. dx +=, dW +=.
  virtual void RmsNorm(Ref<const float> x, WeightRef w, Ref<float> y, Ref<float> rstd, int rows,
                       int width, float eps) = 0;
  virtual void RmsNormBackward(Ref<const float> x, WeightRef w, Ref<const float> rstd,
                               Ref<const float> dy, Ref<float> dx, int rows, int width) = 0;
  // The model's rotary embedding, in place, on [rows, heads, rotary dim] at `positions`.
  virtual void Rope(Ref<float> x, Ref<const int> positions, int rows, int heads) = 0;
  virtual void RopeBackward(Ref<float> dx, Ref<const int> positions, int rows, int heads) = 0;

  // Causal attention within one sequence of `length` rows; probs [heads, length, length] kept.
  virtual void CausalAttention(Ref<const float> q, Ref<const float> k, Ref<const float> v,
                               Ref<float> out, Ref<float> probs, int length,
                               const kernels::AttentionShape& shape) = 0;
  // dq, dk, dv +=.
  virtual void CausalAttentionBackward(Ref<const float> q, Ref<const float> k, Ref<const float> v,
                                       Ref<const float> probs, Ref<const float> dout, Ref<float> dq,
                                       Ref<float> dk, Ref<float> dv, int length,
                                       const kernels::AttentionShape& shape) = 0;
  // One query row over `length` cached keys and values.
  virtual void DecodeAttention(Ref<const float> q, Ref<const float> k_cache,
                               Ref<const float> v_cache, int length, Ref<float> out,
                               const kernels::AttentionShape& shape) = 0;
  // One decode row of each of many sequences: row r's key and value (of k [rows, kv_heads ·
  // qk_dim] and v [rows, kv_heads · v_dim]) join its sequence's caches of the layer, k_caches[r]
  // and v_caches[r], at position positions[r] (host memory), then its query (row r of q) attends
  // over positions 0..positions[r]; out [rows, heads · v_dim]. By default a Copy pair and a
  // DecodeAttention per row; a device backend serves all rows in a launch or two.
  virtual void AppendAndAttend(Ref<const float> q, Ref<const float> k, Ref<const float> v,
                               const std::vector<Ref<float>>& k_caches,
                               const std::vector<Ref<float>>& v_caches, const int* positions,
                               Ref<float> out, const kernels::AttentionShape& shape);

  // out = silu(gate) * up over n values; dgate, dup +=.
  virtual void SwiGlu(Ref<const float> gate, Ref<const float> up, Ref<float> out, int64_t n) = 0;
  virtual void SwiGluBackward(Ref<const float> gate, Ref<const float> up, Ref<const float> dout,
                              Ref<float> dgate, Ref<float> dup, int64_t n) = 0;
  virtual void EmbeddingGather(WeightRef table, Ref<const int> tokens, Ref<float> out, int rows,
                               int width) = 0;
  // dtable +=.
  virtual void EmbeddingBackward(Ref<const float> dout, Ref<const int> tokens, WeightRef table,
                                 int rows, int width) = 0;

  // The router (kernels/cpu/router.h has the contracts); selection_bias may be null.
  virtual void RouterScores(Ref<const float> logits, Ref<float> scores, int rows, int experts,
                            kernels::ScoringFunction scoring) = 0;
  virtual void TopK(Ref<const float> scores, WeightRef selection_bias, int rows, int experts, int k,
                    Ref<int16_t> ids, const kernels::GroupLimit& limit) = 0;
  virtual void GateWeights(Ref<const float> scores, Ref<const int16_t> ids, int rows, int experts,
                           int k, bool normalize, Ref<float> gates) = 0;
  virtual void RouterGatesBackward(Ref<const float> logits, Ref<const float> scores,
                                   Ref<const int16_t> ids, Ref<const float> dgates,
                                   Ref<float> dlogits, int rows, int experts, int k, bool normalize,
                                   kernels::ScoringFunction scoring) = 0;

  // Token dispatch by expert (kernels/cpu/permute.h has the contracts).
  virtual ExpertPermutation BuildPermutation(Ref<const int16_t> ids, int rows, int k,
                                             int experts) = 0;
  virtual void PermuteRows(Ref<const float> x, const ExpertPermutation& permutation, Ref<float> out,
                           int width) = 0;
  virtual void PermuteRowsBackward(Ref<const float> dout, const ExpertPermutation& permutation,
                                   Ref<float> dx, int width) = 0;
  virtual void UnpermuteAdd(Ref<const float> y, const ExpertPermutation& permutation,
                            Ref<const float> gates, Ref<float> out, int width) = 0;
  virtual void UnpermuteAddBackward(Ref<const float> y, const ExpertPermutation& permutation,
                                    Ref<const float> gates, Ref<const float> dout, Ref<float> dy,
                                    Ref<float> dgates, int width) = 0;

  // The LM head's loss over one chunk of the vocabulary at a time, so that no row's whole logits
  // need exist (and a rank of a vocabulary-parallel head holds only its own columns): `logits`
  // [rows, width] are columns [first_column, first_column + width) of each row. FoldLogSumExp
  // folds them into each row's running log-sum-exp `lse` (−inf before its first chunk) and
  // writes target_logit[r] where targets[r] lies among them; after the last chunk
  // log p(target) = target_logit − lse. The backward writes, over the chunk's columns,
  // dlogits[r] = dlogprob[r] · (onehot(targets[r]) − exp(logits[r] − lse[r])) with the final
  // lse (zeros where dlogprob[r] is 0). Targets lie in [0, vocab).
  virtual void FoldLogSumExp(Ref<const float> logits, Ref<const int> targets, Ref<float> lse,
                             Ref<float> target_logit, int rows, int first_column, int width) = 0;
  virtual void TokenLogProbsChunkBackward(Ref<const float> logits, Ref<const int> targets,
                                          Ref<const float> lse, Ref<const float> dlogprob,
                                          Ref<float> dlogits, int rows, int first_column,
                                          int width) = 0;

  // Elementwise.
  virtual void Add(Ref<float> target, Ref<const float> values, int64_t n) = 0;  // target +=
  virtual void Scale(Ref<float> x, float factor, int64_t n) = 0;
  virtual void RoundToBf16(Ref<float> x, int64_t n) = 0;
  // Each row rounded to FP8 E4M3 with a per-row scale (the input of FP8 linear layers).
  virtual void QuantizeRowsToE4M3(Ref<float> x, int64_t rows, int64_t width) = 0;
  // `width` columns of `rows` rows: dst[r·dst_stride + c] (+)= src[r·src_stride + c].
  virtual void CopyColumns(Ref<const float> src, int64_t src_stride, Ref<float> dst,
                           int64_t dst_stride, int64_t rows, int width, bool accumulate) = 0;
  // Each of `count` vectors of `width` (even) reordered [x0, x1, x2, x3, ...] ->
  // [x0, x2, ..., x1, x3, ...] (DeepSeek's interleaved rotary pairs); Reinterleave undoes it.
  virtual void Deinterleave(Ref<float> x, int width, int64_t count) = 0;
  virtual void Reinterleave(Ref<float> x, int width, int64_t count) = 0;

  // Host <-> backend copies of `count` elements (Upload is the front that also sizes).
  virtual void CopyIn(const float* host, Ref<float> target, int64_t count) = 0;
  virtual void CopyIn(const int* host, Ref<int> target, int64_t count) = 0;
  virtual void CopyIn(const int16_t* host, Ref<int16_t> target, int64_t count) = 0;
  virtual void CopyOut(Ref<const float> source, float* host, int64_t count) = 0;
  virtual void CopyOut(Ref<const int16_t> source, int16_t* host, int64_t count) = 0;

 protected:
  // A weight handle in this backend's memory, for Bind.
  static WeightRef MakeWeight(WeightFormat format, const void* values, const float* scales,
                              float* gradient, int64_t size) {
    return WeightRef(format, values, scales, gradient, size);
  }
  // `bytes` of backend memory, freed when the last owner lets go; null when allocation failed
  // (the failure is Finish's to report).
  virtual std::shared_ptr<void> AllocateBytes(int64_t bytes) = 0;
};

template <typename T>
void ModelOps::Resize(Buffer<T>& buffer, int64_t size) {
  if (size > buffer.capacity_) {
    buffer.memory_ = std::static_pointer_cast<T>(AllocateBytes(size * int64_t{sizeof(T)}));
    // A failed allocation (reported by Finish) leaves nothing to reuse: the next pass retries.
    buffer.capacity_ = buffer.memory_ != nullptr ? size : 0;
  }
  buffer.size_ = size;
}

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_MODEL_OPS_H_
