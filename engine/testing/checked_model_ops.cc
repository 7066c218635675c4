#include "engine/testing/checked_model_ops.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tandem::engine::testing {
namespace {

constexpr int64_t kArenaBytes = int64_t{4} << 30;  // Reserved, committed as it is used.
constexpr int64_t kAlignment = 64;

int64_t RoundUp(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

int64_t PageSize() { return sysconf(_SC_PAGESIZE); }

}  // namespace

// One operation in progress: counted, and the arena readable and writable until it returns.
class CheckedModelOps::Call {
 public:
  Call(CheckedModelOps& ops, const char* name) : ops_(ops) {
    ++ops_.calls_[name];
    if (ops_.depth_++ == 0) Protect(PROT_READ | PROT_WRITE);
  }
  ~Call() {
    if (--ops_.depth_ == 0) Protect(PROT_NONE);
  }

 private:
  void Protect(int protection) {
    const int64_t used = RoundUp(ops_.arena_used_, PageSize());
    if (used > 0 && mprotect(ops_.arena_, used, protection) != 0) std::abort();
  }

  CheckedModelOps& ops_;
};

CheckedModelOps::CheckedModelOps(const ModelConfig& config)
    : rope_width_(2 * static_cast<int64_t>(config.RopeFrequencies().inv_freq.size())),
      cpu_(config) {
  void* arena =
      mmap(nullptr, kArenaBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (arena == MAP_FAILED) std::abort();
  arena_ = static_cast<char*>(arena);
}

CheckedModelOps::~CheckedModelOps() { munmap(arena_, kArenaBytes); }

// Bump allocation, never reused (a test's model is small). Fresh memory is filled with 0xFF
// bytes — NaN as floats, -1 as integers — so a graph that reads a buffer before writing it shows
// in its results (the CPU backend's memory is not zeroed either).
std::shared_ptr<void> CheckedModelOps::AllocateBytes(int64_t bytes) {
  const int64_t offset = RoundUp(arena_used_, kAlignment);
  if (offset + bytes > kArenaBytes) std::abort();
  arena_used_ = offset + std::max<int64_t>(bytes, 1);
  const int64_t page = PageSize();
  const int64_t begin = offset / page * page;
  const int64_t length = RoundUp(arena_used_, page) - begin;
  if (mprotect(arena_ + begin, length, PROT_READ | PROT_WRITE) != 0) std::abort();
  std::memset(arena_ + offset, 0xFF, bytes);
  // Inside an operation the new memory stays open (the operation may write it at once).
  if (depth_ == 0 && mprotect(arena_ + begin, length, PROT_NONE) != 0) std::abort();
  return std::shared_ptr<void>(arena_ + offset, [](void*) {});
}

template <typename T>
void CheckedModelOps::Need(const char* call, const char* argument, Ref<T> ref, int64_t count) {
  if (ref.null() || ref.size() >= count) return;
  violations_.push_back(absl::StrCat(call, " ", argument, ": ", ref.size(), " < ", count));
}

void CheckedModelOps::Need(const char* call, const char* argument, WeightRef weight,
                           int64_t count) {
  if (weight.null() || weight.size() >= count) return;
  violations_.push_back(absl::StrCat(call, " ", argument, ": ", weight.size(), " < ", count));
}

const BackendCapabilities& CheckedModelOps::capabilities() const {
  // The CPU's, but no host memory: nothing outside the operations may touch the arena.
  static const BackendCapabilities capabilities{
      .host_memory = false, .weight_formats = {WeightFormat::kF32}, .base_gradients = true};
  return capabilities;
}

absl::StatusOr<WeightRef> CheckedModelOps::Bind(const HostWeight& weight) {
  return cpu_.Bind(weight);
}

absl::Status CheckedModelOps::Finish() {
  Call call(*this, "Finish");
  return cpu_.Finish();
}

void CheckedModelOps::Copy(Ref<const float> source, Ref<float> target, int64_t count) {
  Call call(*this, "Copy");
  Need("Copy", "source", source, count);
  Need("Copy", "target", target, count);
  cpu_.Copy(source, target, count);
}

void CheckedModelOps::Fill(Ref<float> target, float value, int64_t count) {
  Call call(*this, "Fill");
  Need("Fill", "target", target, count);
  cpu_.Fill(target, value, count);
}

void CheckedModelOps::CopyIn(const float* host, Ref<float> target, int64_t count) {
  Call call(*this, "CopyIn");
  Need("CopyIn", "target", target, count);
  cpu_.CopyIn(host, target, count);
}

void CheckedModelOps::CopyIn(const int* host, Ref<int> target, int64_t count) {
  Call call(*this, "CopyIn");
  Need("CopyIn", "target", target, count);
  cpu_.CopyIn(host, target, count);
}

void CheckedModelOps::CopyIn(const int16_t* host, Ref<int16_t> target, int64_t count) {
  Call call(*this, "CopyIn");
  Need("CopyIn", "target", target, count);
  cpu_.CopyIn(host, target, count);
}

void CheckedModelOps::CopyOut(Ref<const float> source, float* host, int64_t count) {
  Call call(*this, "CopyOut");
  Need("CopyOut", "source", source, count);
  cpu_.CopyOut(source, host, count);
}

void CheckedModelOps::CopyOut(Ref<const int16_t> source, int16_t* host, int64_t count) {
  Call call(*this, "CopyOut");
  Need("CopyOut", "source", source, count);
  cpu_.CopyOut(source, host, count);
}

void CheckedModelOps::Linear(Ref<const float> x, WeightRef w, Ref<float> y, int rows, int in,
                             int out, bool accumulate) {
  Call call(*this, "Linear");
  Need("Linear", "x", x, int64_t{rows} * in);
  Need("Linear", "w", w, int64_t{out} * in);
  Need("Linear", "y", y, int64_t{rows} * out);
  cpu_.Linear(x, w, y, rows, in, out, accumulate);
}

void CheckedModelOps::LinearBackward(Ref<const float> x, WeightRef w, Ref<const float> dy,
                                     Ref<float> dx, int rows, int in, int out) {
  Call call(*this, "LinearBackward");
  Need("LinearBackward", "x", x, int64_t{rows} * in);
  Need("LinearBackward", "w", w, int64_t{out} * in);
  Need("LinearBackward", "dy", dy, int64_t{rows} * out);
  Need("LinearBackward", "dx", dx, int64_t{rows} * in);
  cpu_.LinearBackward(x, w, dy, dx, rows, in, out);
}

void CheckedModelOps::ProjectGroups(Ref<const float> x, const std::vector<int>& offsets,
                                    WeightRef w, int64_t w_stride, int in, int out,
                                    const std::optional<LoraProjection>& lora,
                                    Buffer<float>& lora_h, Ref<float> y) {
  Call call(*this, "ProjectGroups");
  const int64_t rows = offsets.back();
  Need("ProjectGroups", "x", x, rows * in);
  Need("ProjectGroups", "w", w,
       static_cast<int64_t>(offsets.size() - 2) * w_stride + int64_t{out} * in);
  Need("ProjectGroups", "y", y, rows * out);
  // Sized here, so that the CPU backend's own Resize finds it large enough and the LoRA
  // intermediate lives in this arena too.
  if (lora.has_value()) Resize(lora_h, rows * lora->rank);
  cpu_.ProjectGroups(x, offsets, w, w_stride, in, out, lora, lora_h, y);
}

void CheckedModelOps::ProjectGroupsBackward(Ref<const float> x, const std::vector<int>& offsets,
                                            WeightRef w, int64_t w_stride, int in, int out,
                                            const std::optional<LoraProjection>& lora,
                                            Ref<const float> lora_h, Ref<const float> dy,
                                            Ref<float> dx) {
  Call call(*this, "ProjectGroupsBackward");
  const int64_t rows = offsets.back();
  Need("ProjectGroupsBackward", "x", x, rows * in);
  Need("ProjectGroupsBackward", "w", w,
       static_cast<int64_t>(offsets.size() - 2) * w_stride + int64_t{out} * in);
  if (lora.has_value()) Need("ProjectGroupsBackward", "lora_h", lora_h, rows * lora->rank);
  Need("ProjectGroupsBackward", "dy", dy, rows * out);
  Need("ProjectGroupsBackward", "dx", dx, rows * in);
  cpu_.ProjectGroupsBackward(x, offsets, w, w_stride, in, out, lora, lora_h, dy, dx);
}

void CheckedModelOps::RmsNorm(Ref<const float> x, WeightRef w, Ref<float> y, Ref<float> rstd,
                              int rows, int width, float eps) {
  Call call(*this, "RmsNorm");
  Need("RmsNorm", "x", x, int64_t{rows} * width);
  Need("RmsNorm", "y", y, int64_t{rows} * width);
  Need("RmsNorm", "rstd", rstd, rows);
  Need("RmsNorm", "w", w, width);
  cpu_.RmsNorm(x, w, y, rstd, rows, width, eps);
}

void CheckedModelOps::RmsNormBackward(Ref<const float> x, WeightRef w, Ref<const float> rstd,
                                      Ref<const float> dy, Ref<float> dx, int rows, int width) {
  Call call(*this, "RmsNormBackward");
  Need("RmsNormBackward", "x", x, int64_t{rows} * width);
  Need("RmsNormBackward", "rstd", rstd, rows);
  Need("RmsNormBackward", "w", w, width);
  Need("RmsNormBackward", "dy", dy, int64_t{rows} * width);
  Need("RmsNormBackward", "dx", dx, int64_t{rows} * width);
  cpu_.RmsNormBackward(x, w, rstd, dy, dx, rows, width);
}

void CheckedModelOps::Rope(Ref<float> x, Ref<const int> positions, int rows, int heads) {
  Call call(*this, "Rope");
  Need("Rope", "x", x, int64_t{rows} * heads * rope_width_);
  Need("Rope", "positions", positions, rows);
  cpu_.Rope(x, positions, rows, heads);
}

void CheckedModelOps::RopeBackward(Ref<float> dx, Ref<const int> positions, int rows, int heads) {
  Call call(*this, "RopeBackward");
  Need("RopeBackward", "dx", dx, int64_t{rows} * heads * rope_width_);
  Need("RopeBackward", "positions", positions, rows);
  cpu_.RopeBackward(dx, positions, rows, heads);
}

void CheckedModelOps::CausalAttention(Ref<const float> q, Ref<const float> k, Ref<const float> v,
                                      Ref<float> out, Ref<float> probs, int length,
                                      const kernels::AttentionShape& shape) {
  Call call(*this, "CausalAttention");
  Need("CausalAttention", "q", q, int64_t{length} * shape.heads * shape.qk_dim);
  Need("CausalAttention", "k", k, int64_t{length} * shape.kv_heads * shape.qk_dim);
  Need("CausalAttention", "v", v, int64_t{length} * shape.kv_heads * shape.v_dim);
  Need("CausalAttention", "out", out, int64_t{length} * shape.heads * shape.v_dim);
  Need("CausalAttention", "probs", probs, int64_t{shape.heads} * length * length);
  cpu_.CausalAttention(q, k, v, out, probs, length, shape);
}

void CheckedModelOps::CausalAttentionBackward(Ref<const float> q, Ref<const float> k,
                                              Ref<const float> v, Ref<const float> probs,
                                              Ref<const float> dout, Ref<float> dq, Ref<float> dk,
                                              Ref<float> dv, int length,
                                              const kernels::AttentionShape& shape) {
  Call call(*this, "CausalAttentionBackward");
  const int64_t queries = int64_t{length} * shape.heads * shape.qk_dim;
  const int64_t keys = int64_t{length} * shape.kv_heads * shape.qk_dim;
  const int64_t values = int64_t{length} * shape.kv_heads * shape.v_dim;
  Need("CausalAttentionBackward", "q", q, queries);
  Need("CausalAttentionBackward", "k", k, keys);
  Need("CausalAttentionBackward", "v", v, values);
  Need("CausalAttentionBackward", "probs", probs, int64_t{shape.heads} * length * length);
  Need("CausalAttentionBackward", "dout", dout, int64_t{length} * shape.heads * shape.v_dim);
  Need("CausalAttentionBackward", "dq", dq, queries);
  Need("CausalAttentionBackward", "dk", dk, keys);
  Need("CausalAttentionBackward", "dv", dv, values);
  cpu_.CausalAttentionBackward(q, k, v, probs, dout, dq, dk, dv, length, shape);
}

void CheckedModelOps::DecodeAttention(Ref<const float> q, Ref<const float> k_cache,
                                      Ref<const float> v_cache, int length, Ref<float> out,
                                      const kernels::AttentionShape& shape) {
  Call call(*this, "DecodeAttention");
  Need("DecodeAttention", "q", q, int64_t{shape.heads} * shape.qk_dim);
  Need("DecodeAttention", "k_cache", k_cache, int64_t{length} * shape.kv_heads * shape.qk_dim);
  Need("DecodeAttention", "v_cache", v_cache, int64_t{length} * shape.kv_heads * shape.v_dim);
  Need("DecodeAttention", "out", out, int64_t{shape.heads} * shape.v_dim);
  cpu_.DecodeAttention(q, k_cache, v_cache, length, out, shape);
}

void CheckedModelOps::SwiGlu(Ref<const float> gate, Ref<const float> up, Ref<float> out,
                             int64_t n) {
  Call call(*this, "SwiGlu");
  Need("SwiGlu", "gate", gate, n);
  Need("SwiGlu", "up", up, n);
  Need("SwiGlu", "out", out, n);
  cpu_.SwiGlu(gate, up, out, n);
}

void CheckedModelOps::SwiGluBackward(Ref<const float> gate, Ref<const float> up,
                                     Ref<const float> dout, Ref<float> dgate, Ref<float> dup,
                                     int64_t n) {
  Call call(*this, "SwiGluBackward");
  Need("SwiGluBackward", "gate", gate, n);
  Need("SwiGluBackward", "up", up, n);
  Need("SwiGluBackward", "dout", dout, n);
  Need("SwiGluBackward", "dgate", dgate, n);
  Need("SwiGluBackward", "dup", dup, n);
  cpu_.SwiGluBackward(gate, up, dout, dgate, dup, n);
}

void CheckedModelOps::EmbeddingGather(WeightRef table, Ref<const int> tokens, Ref<float> out,
                                      int rows, int width) {
  Call call(*this, "EmbeddingGather");
  Need("EmbeddingGather", "tokens", tokens, rows);
  Need("EmbeddingGather", "out", out, int64_t{rows} * width);
  cpu_.EmbeddingGather(table, tokens, out, rows, width);
}

void CheckedModelOps::EmbeddingBackward(Ref<const float> dout, Ref<const int> tokens,
                                        WeightRef table, int rows, int width) {
  Call call(*this, "EmbeddingBackward");
  Need("EmbeddingBackward", "dout", dout, int64_t{rows} * width);
  Need("EmbeddingBackward", "tokens", tokens, rows);
  cpu_.EmbeddingBackward(dout, tokens, table, rows, width);
}

void CheckedModelOps::RouterScores(Ref<const float> logits, Ref<float> scores, int rows,
                                   int experts, kernels::ScoringFunction scoring) {
  Call call(*this, "RouterScores");
  Need("RouterScores", "logits", logits, int64_t{rows} * experts);
  Need("RouterScores", "scores", scores, int64_t{rows} * experts);
  cpu_.RouterScores(logits, scores, rows, experts, scoring);
}

void CheckedModelOps::TopK(Ref<const float> scores, WeightRef selection_bias, int rows, int experts,
                           int k, Ref<int16_t> ids, const kernels::GroupLimit& limit) {
  Call call(*this, "TopK");
  Need("TopK", "scores", scores, int64_t{rows} * experts);
  Need("TopK", "ids", ids, int64_t{rows} * k);
  cpu_.TopK(scores, selection_bias, rows, experts, k, ids, limit);
}

void CheckedModelOps::GateWeights(Ref<const float> scores, Ref<const int16_t> ids, int rows,
                                  int experts, int k, bool normalize, Ref<float> gates) {
  Call call(*this, "GateWeights");
  Need("GateWeights", "scores", scores, int64_t{rows} * experts);
  Need("GateWeights", "ids", ids, int64_t{rows} * k);
  Need("GateWeights", "gates", gates, int64_t{rows} * k);
  cpu_.GateWeights(scores, ids, rows, experts, k, normalize, gates);
}

void CheckedModelOps::RouterGatesBackward(Ref<const float> logits, Ref<const float> scores,
                                          Ref<const int16_t> ids, Ref<const float> dgates,
                                          Ref<float> dlogits, int rows, int experts, int k,
                                          bool normalize, kernels::ScoringFunction scoring) {
  Call call(*this, "RouterGatesBackward");
  Need("RouterGatesBackward", "logits", logits, int64_t{rows} * experts);
  Need("RouterGatesBackward", "scores", scores, int64_t{rows} * experts);
  Need("RouterGatesBackward", "ids", ids, int64_t{rows} * k);
  Need("RouterGatesBackward", "dgates", dgates, int64_t{rows} * k);
  Need("RouterGatesBackward", "dlogits", dlogits, int64_t{rows} * experts);
  cpu_.RouterGatesBackward(logits, scores, ids, dgates, dlogits, rows, experts, k, normalize,
                           scoring);
}

ExpertPermutation CheckedModelOps::BuildPermutation(Ref<const int16_t> ids, int rows, int k,
                                                    int experts) {
  Call call(*this, "BuildPermutation");
  Need("BuildPermutation", "ids", ids, int64_t{rows} * k);
  return cpu_.BuildPermutation(ids, rows, k, experts);
}

void CheckedModelOps::PermuteRows(Ref<const float> x, const ExpertPermutation& permutation,
                                  Ref<float> out, int width) {
  Call call(*this, "PermuteRows");
  const int64_t slots = int64_t{permutation.rows} * permutation.k;
  Need("PermuteRows", "x", x, int64_t{permutation.rows} * width);
  Need("PermuteRows", "out", out, slots * width);
  cpu_.PermuteRows(x, permutation, out, width);
}

void CheckedModelOps::PermuteRowsBackward(Ref<const float> dout,
                                          const ExpertPermutation& permutation, Ref<float> dx,
                                          int width) {
  Call call(*this, "PermuteRowsBackward");
  const int64_t slots = int64_t{permutation.rows} * permutation.k;
  Need("PermuteRowsBackward", "dout", dout, slots * width);
  Need("PermuteRowsBackward", "dx", dx, int64_t{permutation.rows} * width);
  cpu_.PermuteRowsBackward(dout, permutation, dx, width);
}

void CheckedModelOps::UnpermuteAdd(Ref<const float> y, const ExpertPermutation& permutation,
                                   Ref<const float> gates, Ref<float> out, int width) {
  Call call(*this, "UnpermuteAdd");
  const int64_t slots = int64_t{permutation.rows} * permutation.k;
  Need("UnpermuteAdd", "y", y, slots * width);
  Need("UnpermuteAdd", "gates", gates, slots);
  Need("UnpermuteAdd", "out", out, int64_t{permutation.rows} * width);
  cpu_.UnpermuteAdd(y, permutation, gates, out, width);
}

void CheckedModelOps::UnpermuteAddBackward(Ref<const float> y, const ExpertPermutation& permutation,
                                           Ref<const float> gates, Ref<const float> dout,
                                           Ref<float> dy, Ref<float> dgates, int width) {
  Call call(*this, "UnpermuteAddBackward");
  const int64_t slots = int64_t{permutation.rows} * permutation.k;
  Need("UnpermuteAddBackward", "y", y, slots * width);
  Need("UnpermuteAddBackward", "gates", gates, slots);
  Need("UnpermuteAddBackward", "dout", dout, int64_t{permutation.rows} * width);
  Need("UnpermuteAddBackward", "dy", dy, slots * width);
  Need("UnpermuteAddBackward", "dgates", dgates, slots);
  cpu_.UnpermuteAddBackward(y, permutation, gates, dout, dy, dgates, width);
}

void CheckedModelOps::FoldLogSumExp(Ref<const float> logits, Ref<const int> targets, Ref<float> lse,
                                    Ref<float> target_logit, int rows, int first_column,
                                    int width) {
  Call call(*this, "FoldLogSumExp");
  Need("FoldLogSumExp", "logits", logits, int64_t{rows} * width);
  Need("FoldLogSumExp", "targets", targets, rows);
  Need("FoldLogSumExp", "lse", lse, rows);
  Need("FoldLogSumExp", "target_logit", target_logit, rows);
  cpu_.FoldLogSumExp(logits, targets, lse, target_logit, rows, first_column, width);
}

void CheckedModelOps::TokenLogProbsChunkBackward(Ref<const float> logits, Ref<const int> targets,
                                                 Ref<const float> lse, Ref<const float> dlogprob,
                                                 Ref<float> dlogits, int rows, int first_column,
                                                 int width) {
  Call call(*this, "TokenLogProbsChunkBackward");
  Need("TokenLogProbsChunkBackward", "logits", logits, int64_t{rows} * width);
  Need("TokenLogProbsChunkBackward", "targets", targets, rows);
  Need("TokenLogProbsChunkBackward", "lse", lse, rows);
  Need("TokenLogProbsChunkBackward", "dlogprob", dlogprob, rows);
  Need("TokenLogProbsChunkBackward", "dlogits", dlogits, int64_t{rows} * width);
  cpu_.TokenLogProbsChunkBackward(logits, targets, lse, dlogprob, dlogits, rows, first_column,
                                  width);
}

void CheckedModelOps::Add(Ref<float> target, Ref<const float> values, int64_t n) {
  Call call(*this, "Add");
  Need("Add", "target", target, n);
  Need("Add", "values", values, n);
  cpu_.Add(target, values, n);
}

void CheckedModelOps::Scale(Ref<float> x, float factor, int64_t n) {
  Call call(*this, "Scale");
  Need("Scale", "x", x, n);
  cpu_.Scale(x, factor, n);
}

void CheckedModelOps::RoundToBf16(Ref<float> x, int64_t n) {
  Call call(*this, "RoundToBf16");
  Need("RoundToBf16", "x", x, n);
  cpu_.RoundToBf16(x, n);
}

void CheckedModelOps::QuantizeRowsToE4M3(Ref<float> x, int64_t rows, int64_t width) {
  Call call(*this, "QuantizeRowsToE4M3");
  Need("QuantizeRowsToE4M3", "x", x, rows * width);
  cpu_.QuantizeRowsToE4M3(x, rows, width);
}

void CheckedModelOps::CopyColumns(Ref<const float> src, int64_t src_stride, Ref<float> dst,
                                  int64_t dst_stride, int64_t rows, int width, bool accumulate) {
  Call call(*this, "CopyColumns");
  if (rows > 0) {
    Need("CopyColumns", "src", src, (rows - 1) * src_stride + width);
    Need("CopyColumns", "dst", dst, (rows - 1) * dst_stride + width);
  }
  cpu_.CopyColumns(src, src_stride, dst, dst_stride, rows, width, accumulate);
}

void CheckedModelOps::Deinterleave(Ref<float> x, int width, int64_t count) {
  Call call(*this, "Deinterleave");
  Need("Deinterleave", "x", x, width * count);
  cpu_.Deinterleave(x, width, count);
}

void CheckedModelOps::Reinterleave(Ref<float> x, int width, int64_t count) {
  Call call(*this, "Reinterleave");
  Need("Reinterleave", "x", x, width * count);
  cpu_.Reinterleave(x, width, count);
}

}  // namespace tandem::engine::testing
