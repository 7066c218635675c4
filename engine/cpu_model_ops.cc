#include "engine/cpu_model_ops.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "engine/buffer_access.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/grouped_lora.h"
#include "kernels/cpu/loss.h"
#include "kernels/cpu/permute.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/router.h"
#include "kernels/cpu/swiglu.h"

namespace tandem::engine {
namespace {

template <typename T>
T* At(Ref<T> ref) {
  return BufferAccess::Address(ref);
}

// The CPU kernels take float32 weights (Bind accepts no other format).
const float* Values(WeightRef weight) { return BufferAccess::Values<float>(weight); }
float* Gradient(WeightRef weight) { return BufferAccess::Gradient(weight); }

// The grouped LoRA kernels' view of a bound projection.
kernels::GroupedLoraWeights Kernel(const LoraProjection& lora) {
  return {Values(lora.a),      Values(lora.b), lora.a_group_stride,
          lora.b_group_stride, lora.rank,      lora.scale};
}

const cpu::ExpertPermutation& Cpu(const ExpertPermutation& permutation) {
  return *static_cast<const cpu::ExpertPermutation*>(permutation.state.get());
}

}  // namespace

CpuModelOps::CpuModelOps(const ModelConfig& config)
    : rope_(config.RopeFrequencies()), decode_scratch_(config.max_seq_len) {}

absl::Status CpuModelOps::Finish() { return absl::OkStatus(); }

const BackendCapabilities& CpuModelOps::capabilities() const {
  static const BackendCapabilities capabilities{
      .host_memory = true, .weight_formats = {WeightFormat::kF32}, .base_gradients = true};
  return capabilities;
}

absl::StatusOr<WeightRef> CpuModelOps::Bind(const HostWeight& weight) {
  if (!capabilities().Accepts(weight.format)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the CPU backend computes with f32 weights, not ", WeightFormatName(weight.format)));
  }
  return MakeWeight(weight.format, weight.values, weight.scales, weight.gradient, weight.size);
}

std::shared_ptr<void> CpuModelOps::AllocateBytes(int64_t bytes) {
  return std::shared_ptr<void>(std::malloc(std::max<int64_t>(bytes, 1)), std::free);
}

void CpuModelOps::Copy(Ref<const float> source, Ref<float> target, int64_t count) {
  std::copy_n(At(source), count, At(target));
}

void CpuModelOps::Fill(Ref<float> target, float value, int64_t count) {
  std::fill_n(At(target), count, value);
}

void CpuModelOps::CopyIn(const float* host, Ref<float> target, int64_t count) {
  std::copy_n(host, count, At(target));
}

void CpuModelOps::CopyIn(const int* host, Ref<int> target, int64_t count) {
  std::copy_n(host, count, At(target));
}

void CpuModelOps::CopyIn(const int16_t* host, Ref<int16_t> target, int64_t count) {
  std::copy_n(host, count, At(target));
}

void CpuModelOps::CopyOut(Ref<const float> source, float* host, int64_t count) {
  std::copy_n(At(source), count, host);
}

void CpuModelOps::CopyOut(Ref<const int16_t> source, int16_t* host, int64_t count) {
  std::copy_n(At(source), count, host);
}

void CpuModelOps::Linear(Ref<const float> x, WeightRef w, Ref<float> y, int rows, int in, int out,
                         bool accumulate) {
  cpu::Linear(At(x), Values(w), At(y), rows, in, out, accumulate);
}

void CpuModelOps::LinearBackward(Ref<const float> x, WeightRef w, Ref<const float> dy,
                                 Ref<float> dx, int rows, int in, int out) {
  cpu::LinearBackward(At(x), Values(w), At(dy), At(dx), Gradient(w), rows, in, out);
}

void CpuModelOps::ProjectGroups(Ref<const float> x_ref, const std::vector<int>& offsets,
                                WeightRef w, int64_t w_stride, int in, int out,
                                const std::optional<LoraProjection>& lora, Buffer<float>& lora_h,
                                Ref<float> y_ref) {
  const float* x = At(x_ref);
  float* y = At(y_ref);
  const int groups = static_cast<int>(offsets.size()) - 1;
  for (int g = 0; g < groups; ++g) {
    const int rows = offsets[g + 1] - offsets[g];
    if (rows == 0) continue;
    cpu::Gemm(false, true, rows, out, in, 1.0f, x + int64_t{offsets[g]} * in, in,
              Values(w) + g * w_stride, in, 0.0f, y + int64_t{offsets[g]} * out, out);
  }
  if (!lora.has_value()) return;
  Resize(lora_h, int64_t{offsets.back()} * lora->rank);
  cpu::GroupedLoraForward(x, offsets.data(), groups, in, out, Kernel(*lora), At(lora_h.ref()), y);
}

void CpuModelOps::ProjectGroupsBackward(Ref<const float> x_ref, const std::vector<int>& offsets,
                                        WeightRef w, int64_t w_stride, int in, int out,
                                        const std::optional<LoraProjection>& lora,
                                        Ref<const float> lora_h, Ref<const float> dy_ref,
                                        Ref<float> dx_ref) {
  const float* x = At(x_ref);
  const float* dy = At(dy_ref);
  float* dx = At(dx_ref);
  float* w_grad = Gradient(w);
  const int groups = static_cast<int>(offsets.size()) - 1;
  for (int g = 0; g < groups; ++g) {
    const int rows = offsets[g + 1] - offsets[g];
    if (rows == 0) continue;
    const float* dy_g = dy + int64_t{offsets[g]} * out;
    const float* x_g = x + int64_t{offsets[g]} * in;
    cpu::Gemm(false, false, rows, in, out, 1.0f, dy_g, out, Values(w) + g * w_stride, in, 1.0f,
              dx + int64_t{offsets[g]} * in, in);
    if (w_grad != nullptr) {
      cpu::Gemm(true, false, out, in, rows, 1.0f, dy_g, out, x_g, in, 1.0f, w_grad + g * w_stride,
                in);
    }
  }
  if (!lora.has_value()) return;
  cpu::GroupedLoraBackward(x, offsets.data(), groups, in, out, Kernel(*lora), At(lora_h), dy, dx,
                           Gradient(lora->a), Gradient(lora->b));
}

void CpuModelOps::RmsNorm(Ref<const float> x, WeightRef w, Ref<float> y, Ref<float> rstd, int rows,
                          int width, float eps) {
  cpu::RmsNorm(At(x), Values(w), At(y), At(rstd), rows, width, eps);
}

void CpuModelOps::RmsNormBackward(Ref<const float> x, WeightRef w, Ref<const float> rstd,
                                  Ref<const float> dy, Ref<float> dx, int rows, int width) {
  cpu::RmsNormBackward(At(x), Values(w), At(rstd), At(dy), At(dx), Gradient(w), rows, width);
}

void CpuModelOps::Rope(Ref<float> x, Ref<const int> positions, int rows, int heads) {
  cpu::Rope(At(x), At(positions), rows, heads, rope_);
}

void CpuModelOps::RopeBackward(Ref<float> dx, Ref<const int> positions, int rows, int heads) {
  cpu::RopeBackward(At(dx), At(positions), rows, heads, rope_);
}

void CpuModelOps::CausalAttention(Ref<const float> q, Ref<const float> k, Ref<const float> v,
                                  Ref<float> out, Ref<float> probs, int length,
                                  const kernels::AttentionShape& shape) {
  cpu::CausalAttention(At(q), At(k), At(v), At(out), At(probs), length, shape);
}

void CpuModelOps::CausalAttentionBackward(Ref<const float> q, Ref<const float> k,
                                          Ref<const float> v, Ref<const float> probs,
                                          Ref<const float> dout, Ref<float> dq, Ref<float> dk,
                                          Ref<float> dv, int length,
                                          const kernels::AttentionShape& shape) {
  cpu::CausalAttentionBackward(At(q), At(k), At(v), At(probs), At(dout), At(dq), At(dk), At(dv),
                               length, shape);
}

void CpuModelOps::DecodeAttention(Ref<const float> q, Ref<const float> k_cache,
                                  Ref<const float> v_cache, int length, Ref<float> out,
                                  const kernels::AttentionShape& shape) {
  cpu::DecodeAttention(At(q), At(k_cache), At(v_cache), length, At(out), shape,
                       decode_scratch_.data());
}

void CpuModelOps::SwiGlu(Ref<const float> gate, Ref<const float> up, Ref<float> out, int64_t n) {
  cpu::SwiGlu(At(gate), At(up), At(out), n);
}

void CpuModelOps::SwiGluBackward(Ref<const float> gate, Ref<const float> up, Ref<const float> dout,
                                 Ref<float> dgate, Ref<float> dup, int64_t n) {
  cpu::SwiGluBackward(At(gate), At(up), At(dout), At(dgate), At(dup), n);
}

void CpuModelOps::EmbeddingGather(WeightRef table, Ref<const int> tokens, Ref<float> out, int rows,
                                  int width) {
  cpu::EmbeddingGather(Values(table), At(tokens), At(out), rows, width);
}

void CpuModelOps::EmbeddingBackward(Ref<const float> dout, Ref<const int> tokens, WeightRef table,
                                    int rows, int width) {
  cpu::EmbeddingBackward(At(dout), At(tokens), Gradient(table), rows, width);
}

void CpuModelOps::RouterScores(Ref<const float> logits, Ref<float> scores, int rows, int experts,
                               kernels::ScoringFunction scoring) {
  cpu::RouterScores(At(logits), At(scores), rows, experts, scoring);
}

void CpuModelOps::TopK(Ref<const float> scores, WeightRef selection_bias, int rows, int experts,
                       int k, Ref<int16_t> ids, const kernels::GroupLimit& limit) {
  cpu::TopK(At(scores), Values(selection_bias), rows, experts, k, At(ids), limit);
}

void CpuModelOps::GateWeights(Ref<const float> scores, Ref<const int16_t> ids, int rows,
                              int experts, int k, bool normalize, Ref<float> gates) {
  cpu::GateWeights(At(scores), At(ids), rows, experts, k, normalize, At(gates));
}

void CpuModelOps::RouterGatesBackward(Ref<const float> logits, Ref<const float> scores,
                                      Ref<const int16_t> ids, Ref<const float> dgates,
                                      Ref<float> dlogits, int rows, int experts, int k,
                                      bool normalize, kernels::ScoringFunction scoring) {
  cpu::RouterGatesBackward(At(logits), At(scores), At(ids), At(dgates), At(dlogits), rows, experts,
                           k, normalize, scoring);
}

ExpertPermutation CpuModelOps::BuildPermutation(Ref<const int16_t> ids, int rows, int k,
                                                int experts) {
  auto built =
      std::make_shared<cpu::ExpertPermutation>(cpu::BuildPermutation(At(ids), rows, k, experts));
  return ExpertPermutation{.offsets = built->offsets, .rows = rows, .k = k, .state = built};
}

void CpuModelOps::PermuteRows(Ref<const float> x, const ExpertPermutation& permutation,
                              Ref<float> out, int width) {
  cpu::PermuteRows(At(x), Cpu(permutation), At(out), width);
}

void CpuModelOps::PermuteRowsBackward(Ref<const float> dout, const ExpertPermutation& permutation,
                                      Ref<float> dx, int width) {
  cpu::PermuteRowsBackward(At(dout), Cpu(permutation), At(dx), width);
}

void CpuModelOps::UnpermuteAdd(Ref<const float> y, const ExpertPermutation& permutation,
                               Ref<const float> gates, Ref<float> out, int width) {
  cpu::UnpermuteAdd(At(y), Cpu(permutation), At(gates), At(out), width);
}

void CpuModelOps::UnpermuteAddBackward(Ref<const float> y, const ExpertPermutation& permutation,
                                       Ref<const float> gates, Ref<const float> dout, Ref<float> dy,
                                       Ref<float> dgates, int width) {
  cpu::UnpermuteAddBackward(At(y), Cpu(permutation), At(gates), At(dout), At(dy), At(dgates),
                            width);
}

void CpuModelOps::FoldLogSumExp(Ref<const float> logits, Ref<const int> targets, Ref<float> lse,
                                Ref<float> target_logit, int rows, int first_column, int width) {
  cpu::FoldLogSumExp(At(logits), At(targets), At(lse), At(target_logit), rows, first_column, width);
}

void CpuModelOps::TokenLogProbsChunkBackward(Ref<const float> logits, Ref<const int> targets,
                                             Ref<const float> lse, Ref<const float> dlogprob,
                                             Ref<float> dlogits, int rows, int first_column,
                                             int width) {
  cpu::TokenLogProbsChunkBackward(At(logits), At(targets), At(lse), At(dlogprob), At(dlogits), rows,
                                  first_column, width);
}

void CpuModelOps::Add(Ref<float> target_ref, Ref<const float> values_ref, int64_t n) {
  float* target = At(target_ref);
  const float* values = At(values_ref);
  for (int64_t i = 0; i < n; ++i) target[i] += values[i];
}

void CpuModelOps::Scale(Ref<float> x_ref, float factor, int64_t n) {
  float* x = At(x_ref);
  for (int64_t i = 0; i < n; ++i) x[i] *= factor;
}

void CpuModelOps::RoundToBf16(Ref<float> x_ref, int64_t n) {
  float* x = At(x_ref);
  for (int64_t i = 0; i < n; ++i) x[i] = ToFloat(ToBFloat16(x[i]));
}

void CpuModelOps::QuantizeRowsToE4M3(Ref<float> x, int64_t rows, int64_t width) {
  cpu::QuantizeRowsToE4M3(At(x), rows, width);
}

void CpuModelOps::CopyColumns(Ref<const float> src, int64_t src_stride, Ref<float> dst,
                              int64_t dst_stride, int64_t rows, int width, bool accumulate) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* from = At(src) + r * src_stride;
    float* to = At(dst) + r * dst_stride;
    if (accumulate) {
      for (int c = 0; c < width; ++c) to[c] += from[c];
    } else {
      std::copy_n(from, width, to);
    }
  }
}

void CpuModelOps::Deinterleave(Ref<float> x_ref, int width, int64_t count) {
  float* x = At(x_ref);
  std::vector<float> reordered(width);
  for (int64_t n = 0; n < count; ++n) {
    float* v = x + n * width;
    for (int i = 0; i < width / 2; ++i) {
      reordered[i] = v[2 * i];
      reordered[width / 2 + i] = v[2 * i + 1];
    }
    std::copy(reordered.begin(), reordered.end(), v);
  }
}

void CpuModelOps::Reinterleave(Ref<float> x_ref, int width, int64_t count) {
  float* x = At(x_ref);
  std::vector<float> original(width);
  for (int64_t n = 0; n < count; ++n) {
    float* v = x + n * width;
    for (int i = 0; i < width / 2; ++i) {
      original[2 * i] = v[i];
      original[2 * i + 1] = v[width / 2 + i];
    }
    std::copy(original.begin(), original.end(), v);
  }
}

}  // namespace tandem::engine
