#include "engine/cuda/cuda_model_ops.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/buffer_access.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/grouped_lora.h"
#include "kernels/cuda/loss.h"
#include "kernels/cuda/permute.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/router.h"
#include "kernels/cuda/swiglu.h"

namespace tandem::engine::cuda {
namespace gpu = ::tandem::cuda;
namespace {

template <typename T>
T* At(Ref<T> ref) {
  return BufferAccess::Address(ref);
}

// A bound weight's device values (CUDA binds f32 only).
const float* Weight(WeightRef weight) { return BufferAccess::Values<float>(weight); }

// The grouped LoRA kernels' view of a bound projection.
kernels::GroupedLoraWeights Kernel(const LoraProjection& lora) {
  return {Weight(lora.a),      Weight(lora.b), lora.a_group_stride,
          lora.b_group_stride, lora.rank,      lora.scale};
}

const gpu::DevicePermutation& Device(const ExpertPermutation& permutation) {
  return *static_cast<const gpu::DevicePermutation*>(permutation.state.get());
}

// The device tensor holding `host`, a pointer into one of `parameters`' values (or, with
// `gradients`, into their gradients), at the same offset.
float* Translate(const DeviceParameters& device, const ParameterSet& parameters, const float* host,
                 bool gradients) {
  for (const std::string& name : parameters.names()) {
    const Parameter& parameter = *parameters.Find(name);
    const std::vector<float>& host_tensor = gradients ? parameter.grad : parameter.value;
    if (host >= host_tensor.data() && host < host_tensor.data() + host_tensor.size()) {
      float* tensor = device.Find(name);
      return tensor == nullptr ? nullptr : tensor + (host - host_tensor.data());
    }
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaModelOps>> CudaModelOps::Create(
    const ModelConfig& config, int device, const BaseModel& base,
    std::shared_ptr<const DeviceParameters> base_device, LoraAdapter* lora) {
  if (absl::Status status = gpu::SelectDevice(device).status(); !status.ok()) return status;
  absl::StatusOr<gpu::DeviceRopeFrequencies> rope =
      gpu::DeviceRopeFrequencies::Upload(config.RopeFrequencies());
  if (!rope.ok()) return rope.status();
  std::unique_ptr<CudaModelOps> ops(
      new CudaModelOps(device, base, std::move(base_device), lora, *std::move(rope)));
  if (std::getenv("TANDEM_CUDA_PROFILE") != nullptr) {
    ops->times_ = std::make_unique<OperationTimes>();
  }
  if (lora != nullptr) {
    absl::StatusOr<DeviceParameters> adapter = DeviceParameters::Upload(lora->parameters());
    if (!adapter.ok()) return adapter.status();
    ops->adapter_device_ = *std::move(adapter);
  }
  return ops;
}

absl::Status CudaModelOps::AdapterChanged() {
  if (lora_ == nullptr) return absl::OkStatus();
  if (absl::Status status = gpu::UseDevice(device_); !status.ok()) return status;
  return adapter_device_->Refresh(lora_->parameters());
}

void CudaModelOps::Run(const char* name, absl::FunctionRef<absl::Status()> launch) {
  if (Failed()) return;
  const auto start = std::chrono::steady_clock::now();
  // CUDA's current device is per thread, and engines are called from several threads.
  absl::Status status = gpu::UseDevice(device_);
  if (status.ok()) status = launch();
  if (status.ok() && times_ != nullptr) {
    status = gpu::Synchronize();
    times_->Add(name,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  if (!status.ok()) {
    status_ = absl::Status(status.code(), absl::StrCat(name, ": ", status.message()));
  }
}

void CudaModelOps::Refuse(const char* name, const char* why) {
  if (Failed()) return;
  status_ = absl::UnimplementedError(absl::StrCat(name, " on CUDA: ", why));
}

absl::Status CudaModelOps::Finish() {
  Run("Synchronize", [] { return gpu::Synchronize(); });
  if (Failed() && adapter_gradients_.has_value()) {
    // A failed pass's partial gradients must not reach a later one's.
    adapter_gradients_->Zero().IgnoreError();
    gradients_written_ = false;
  }
  if (!Failed() && gradients_written_) {
    // One download per tensor; the host gradients accumulate as the CPU backend's do.
    ParameterSet& host = lora_->parameters();
    std::vector<float> downloaded;
    for (const std::string& name : host.names()) {
      Parameter& parameter = *host.Find(name);
      downloaded.resize(parameter.grad.size());
      Run("gradients to the host", [&] {
        return gpu::CopyToHost(downloaded.data(), adapter_gradients_->Find(name),
                               downloaded.size() * sizeof(float));
      });
      if (Failed()) break;
      for (size_t i = 0; i < downloaded.size(); ++i) parameter.grad[i] += downloaded[i];
    }
    Run("zero gradients", [&] { return adapter_gradients_->Zero(); });
    gradients_written_ = false;
  }
  return std::exchange(status_, absl::OkStatus());
}

std::shared_ptr<void> CudaModelOps::AllocateBytes(int64_t bytes) {
  auto memory = std::make_shared<gpu::DeviceMemory>();
  Run("allocate", [&]() -> absl::Status {
    absl::StatusOr<gpu::DeviceMemory> allocated =
        gpu::DeviceMemory::Allocate(std::max<int64_t>(bytes, 1));
    if (!allocated.ok()) return allocated.status();
    *memory = *std::move(allocated);
    return absl::OkStatus();
  });
  if (memory->data() == nullptr) return nullptr;  // Failed: the buffer stays unallocated.
  return std::shared_ptr<void>(memory, memory->data());
}

const BackendCapabilities& CudaModelOps::capabilities() const {
  static const BackendCapabilities capabilities{
      .host_memory = false, .weight_formats = {WeightFormat::kF32}, .base_gradients = false};
  return capabilities;
}

absl::StatusOr<WeightRef> CudaModelOps::Bind(const HostWeight& weight) {
  if (!capabilities().Accepts(weight.format)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the CUDA backend computes with f32 weights, not ", WeightFormatName(weight.format)));
  }
  const float* host = static_cast<const float*>(weight.values);
  const float* device = Translate(*base_device_, base_.parameters(), host, false);
  float* gradient = nullptr;  // Only the adapter trains on the GPU (capabilities()).
  if (device == nullptr && lora_ != nullptr) {
    device = Translate(*adapter_device_, lora_->parameters(), host, false);
    if (device != nullptr && weight.gradient != nullptr) {
      if (absl::Status status = MirrorAdapterGradients(); !status.ok()) return status;
      gradient = Translate(*adapter_gradients_, lora_->parameters(), weight.gradient, true);
    }
  }
  if (device == nullptr) {
    return absl::FailedPreconditionError(
        "the CUDA backend holds no device copy of this weight: it is in neither the model nor "
        "the adapter the backend was made for");
  }
  return MakeWeight(weight.format, device, nullptr, gradient, weight.size);
}

absl::Status CudaModelOps::MirrorAdapterGradients() {
  if (adapter_gradients_.has_value()) return absl::OkStatus();
  if (absl::Status status = gpu::UseDevice(device_); !status.ok()) return status;
  absl::StatusOr<DeviceParameters> gradients = DeviceParameters::Upload(lora_->parameters());
  if (!gradients.ok()) return gradients.status();
  if (absl::Status status = gradients->Zero(); !status.ok()) return status;
  adapter_gradients_ = *std::move(gradients);
  return absl::OkStatus();
}

float* CudaModelOps::WrittenGradient(WeightRef weight) {
  float* gradient = BufferAccess::Gradient(weight);
  if (gradient != nullptr) gradients_written_ = true;
  return gradient;
}

const int* CudaModelOps::DeviceOffsets(const std::vector<int>& offsets, int& max_rows) {
  max_rows = offsets.back();  // GroupedGemm sizes its grid by all rows, not the largest group.
  return Staged(staged_ints_, offsets);
}

template <typename T>
T* CudaModelOps::Staged(StagedValues<T>& staged, const std::vector<T>& host) {
  T* device = nullptr;
  Run("host values to the device", [&]() -> absl::Status {
    absl::StatusOr<T*> copy = staged.Get(host);
    if (!copy.ok()) return copy.status();
    device = *copy;
    return absl::OkStatus();
  });
  return device;
}

float* CudaModelOps::Scratch(gpu::DeviceArray<float>& scratch, int64_t floats) {
  Run("scratch", [&]() -> absl::Status {
    if (static_cast<int64_t>(scratch.size()) >= floats) return absl::OkStatus();
    // Doubling: decode's scratch grows by a position a step.
    absl::StatusOr<gpu::DeviceArray<float>> grown =
        gpu::DeviceArray<float>::Zeros(std::max<int64_t>(floats, 2 * scratch.size()));
    if (!grown.ok()) return grown.status();
    scratch = *std::move(grown);
    return absl::OkStatus();
  });
  return scratch.data();
}

void CudaModelOps::Copy(Ref<const float> source, Ref<float> target, int64_t count) {
  Run("Copy", [&] { return gpu::CopyOnDevice(At(target), At(source), count * sizeof(float)); });
}

void CudaModelOps::Fill(Ref<float> target, float value, int64_t count) {
  if (value != 0.0f) return Refuse("Fill", "only zeros");
  Run("Fill", [&] { return gpu::ZeroDevice(At(target), count * sizeof(float)); });
}

void CudaModelOps::CopyIn(const float* host, Ref<float> target, int64_t count) {
  Run("CopyIn", [&] { return gpu::CopyToDevice(At(target), host, count * sizeof(float)); });
}

void CudaModelOps::CopyIn(const int* host, Ref<int> target, int64_t count) {
  Run("CopyIn", [&] { return gpu::CopyToDevice(At(target), host, count * sizeof(int)); });
}

void CudaModelOps::CopyIn(const int16_t* host, Ref<int16_t> target, int64_t count) {
  Run("CopyIn", [&] { return gpu::CopyToDevice(At(target), host, count * sizeof(int16_t)); });
}

void CudaModelOps::CopyOut(Ref<const float> source, float* host, int64_t count) {
  Run("CopyOut", [&] { return gpu::CopyToHost(host, At(source), count * sizeof(float)); });
}

void CudaModelOps::CopyOut(Ref<const int16_t> source, int16_t* host, int64_t count) {
  Run("CopyOut", [&] { return gpu::CopyToHost(host, At(source), count * sizeof(int16_t)); });
}

void CudaModelOps::Multiply(const char* name, Ref<const float> x, const int* offsets, int groups,
                            int max_rows, WeightRef w, int64_t w_stride, int in, int out,
                            Ref<float> y, float beta) {
  Run(name, [&] {
    return gpu::GroupedGemm({.a = At(x),
                             .lda = in,
                             .w = Weight(w),
                             .w_group_stride = w_stride,
                             .ldw = in,
                             .transpose_w = true,
                             .c = At(y),
                             .ldc = out,
                             .n = out,
                             .k = in,
                             .beta = beta},
                            offsets, groups, max_rows);
  });
}

void CudaModelOps::MultiplyBackward(const char* name, Ref<const float> dy, const int* offsets,
                                    int groups, int max_rows, WeightRef w, int64_t w_stride, int in,
                                    int out, Ref<float> dx) {
  Run(name, [&] {
    return gpu::GroupedGemm({.a = At(dy),
                             .lda = out,
                             .w = Weight(w),
                             .w_group_stride = w_stride,
                             .ldw = in,
                             .transpose_w = false,
                             .c = At(dx),
                             .ldc = in,
                             .n = in,
                             .k = out,
                             .beta = 1.0f},
                            offsets, groups, max_rows);
  });
}

void CudaModelOps::Linear(Ref<const float> x, WeightRef w, Ref<float> y, int rows, int in, int out,
                          bool accumulate) {
  if (rows == 0) return;
  int max_rows = 0;
  const int* offsets = DeviceOffsets({0, rows}, max_rows);
  Multiply("Linear", x, offsets, 1, max_rows, w, 0, in, out, y, accumulate ? 1.0f : 0.0f);
}

void CudaModelOps::LinearBackward(Ref<const float> x, WeightRef w, Ref<const float> dy,
                                  Ref<float> dx, int rows, int in, int out) {
  if (rows == 0) return;
  int max_rows = 0;
  const int* offsets = DeviceOffsets({0, rows}, max_rows);
  MultiplyBackward("LinearBackward", dy, offsets, 1, max_rows, w, 0, in, out, dx);
}

void CudaModelOps::ProjectGroups(Ref<const float> x, const std::vector<int>& offsets, WeightRef w,
                                 int64_t w_stride, int in, int out,
                                 const std::optional<LoraProjection>& lora, Buffer<float>& lora_h,
                                 Ref<float> y) {
  if (offsets.back() == 0) return;
  const int groups = static_cast<int>(offsets.size()) - 1;
  int max_rows = 0;
  const int* device_offsets = DeviceOffsets(offsets, max_rows);
  Multiply("ProjectGroups", x, device_offsets, groups, max_rows, w, w_stride, in, out, y, 0.0f);
  if (!lora.has_value()) return;
  Resize(lora_h, int64_t{offsets.back()} * lora->rank);
  Run("ProjectGroups LoRA", [&] {
    return gpu::GroupedLoraForward(At(x), device_offsets, groups, max_rows, in, out, Kernel(*lora),
                                   At(lora_h.ref()), At(y));
  });
}

void CudaModelOps::ProjectGroupsBackward(Ref<const float> x, const std::vector<int>& offsets,
                                         WeightRef w, int64_t w_stride, int in, int out,
                                         const std::optional<LoraProjection>& lora,
                                         Ref<const float> lora_h, Ref<const float> dy,
                                         Ref<float> dx) {
  if (offsets.back() == 0) return;
  const int groups = static_cast<int>(offsets.size()) - 1;
  int max_rows = 0;
  const int* device_offsets = DeviceOffsets(offsets, max_rows);
  MultiplyBackward("ProjectGroupsBackward", dy, device_offsets, groups, max_rows, w, w_stride, in,
                   out, dx);
  if (!lora.has_value()) return;
  float* dh = Scratch(lora_workspace_, int64_t{offsets.back()} * lora->rank);
  float* a_grad = WrittenGradient(lora->a);
  float* b_grad = WrittenGradient(lora->b);
  Run("ProjectGroupsBackward LoRA", [&] {
    return gpu::GroupedLoraBackward(At(x), device_offsets, groups, max_rows, in, out, Kernel(*lora),
                                    At(lora_h), At(dy), At(dx), a_grad, b_grad, dh);
  });
}

void CudaModelOps::RmsNorm(Ref<const float> x, WeightRef w, Ref<float> y, Ref<float> rstd, int rows,
                           int width, float eps) {
  Run("RmsNorm", [&] { return gpu::RmsNorm(At(x), Weight(w), At(y), At(rstd), rows, width, eps); });
}

void CudaModelOps::RmsNormBackward(Ref<const float> x, WeightRef w, Ref<const float> rstd,
                                   Ref<const float> dy, Ref<float> dx, int rows, int width) {
  Run("RmsNormBackward", [&] {
    return gpu::RmsNormBackward(At(x), Weight(w), At(rstd), At(dy), At(dx), nullptr, rows, width);
  });
}

void CudaModelOps::Rope(Ref<float> x, Ref<const int> positions, int rows, int heads) {
  Run("Rope", [&] { return gpu::Rope(At(x), At(positions), rows, heads, rope_); });
}

void CudaModelOps::RopeBackward(Ref<float> dx, Ref<const int> positions, int rows, int heads) {
  Run("RopeBackward", [&] { return gpu::RopeBackward(At(dx), At(positions), rows, heads, rope_); });
}

void CudaModelOps::CausalAttention(Ref<const float> q, Ref<const float> k, Ref<const float> v,
                                   Ref<float> out, Ref<float> probs, int length,
                                   const kernels::AttentionShape& shape) {
  Run("CausalAttention",
      [&] { return gpu::CausalAttention(At(q), At(k), At(v), At(out), At(probs), length, shape); });
}

void CudaModelOps::CausalAttentionBackward(Ref<const float> q, Ref<const float> k,
                                           Ref<const float> v, Ref<const float> probs,
                                           Ref<const float> dout, Ref<float> dq, Ref<float> dk,
                                           Ref<float> dv, int length,
                                           const kernels::AttentionShape& shape) {
  float* workspace =
      Scratch(attention_workspace_, gpu::AttentionBackwardWorkspaceFloats(length, shape));
  Run("CausalAttentionBackward", [&] {
    return gpu::CausalAttentionBackward(At(q), At(k), At(v), At(probs), At(dout), At(dq), At(dk),
                                        At(dv), length, shape, workspace);
  });
}

void CudaModelOps::DecodeAttention(Ref<const float> q, Ref<const float> k_cache,
                                   Ref<const float> v_cache, int length, Ref<float> out,
                                   const kernels::AttentionShape& shape) {
  float* scratch = Scratch(decode_scratch_, int64_t{shape.heads} * length);
  Run("DecodeAttention", [&] {
    return gpu::DecodeAttention(At(q), At(k_cache), At(v_cache), length, At(out), shape, scratch);
  });
}

void CudaModelOps::AppendAndAttend(Ref<const float> q, Ref<const float> k, Ref<const float> v,
                                   const std::vector<Ref<float>>& k_caches,
                                   const std::vector<Ref<float>>& v_caches, const int* positions,
                                   Ref<float> out, const kernels::AttentionShape& shape) {
  const int rows = static_cast<int>(k_caches.size());
  if (rows == 0) return;
  // The caches' addresses, keys' then values', and the positions then the lengths after this row.
  std::vector<float*> caches(2 * rows);
  std::vector<int> places(2 * rows);
  int longest = 0;
  for (int row = 0; row < rows; ++row) {
    caches[row] = At(k_caches[row]);
    caches[rows + row] = At(v_caches[row]);
    places[row] = positions[row];
    places[rows + row] = positions[row] + 1;
    longest = std::max(longest, positions[row] + 1);
  }
  float* const* device_caches = Staged(staged_addresses_, caches);
  const int* device_places = Staged(staged_ints_, places);
  float* scratch = Scratch(decode_scratch_, int64_t{rows} * shape.heads * longest);
  Run("AppendAndAttend", [&]() -> absl::Status {
    if (absl::Status status =
            gpu::AppendToCaches(At(k), At(v), device_caches, device_caches + rows, device_places,
                                rows, shape.kv_heads * shape.qk_dim, shape.kv_heads * shape.v_dim);
        !status.ok()) {
      return status;
    }
    return gpu::BatchedDecodeAttention(At(q), device_caches, device_caches + rows,
                                       device_places + rows, rows, longest, At(out), shape,
                                       scratch);
  });
}

void CudaModelOps::SwiGlu(Ref<const float> gate, Ref<const float> up, Ref<float> out, int64_t n) {
  Run("SwiGlu", [&] { return gpu::SwiGlu(At(gate), At(up), At(out), n); });
}

void CudaModelOps::SwiGluBackward(Ref<const float> gate, Ref<const float> up, Ref<const float> dout,
                                  Ref<float> dgate, Ref<float> dup, int64_t n) {
  Run("SwiGluBackward",
      [&] { return gpu::SwiGluBackward(At(gate), At(up), At(dout), At(dgate), At(dup), n); });
}

void CudaModelOps::EmbeddingGather(WeightRef table, Ref<const int> tokens, Ref<float> out, int rows,
                                   int width) {
  Run("EmbeddingGather",
      [&] { return gpu::EmbeddingGather(Weight(table), At(tokens), At(out), rows, width); });
}

void CudaModelOps::EmbeddingBackward(Ref<const float> /*dout*/, Ref<const int> /*tokens*/,
                                     WeightRef /*table*/, int /*rows*/, int /*width*/) {
  Refuse("EmbeddingBackward", "the embedding is frozen on the GPU");
}

void CudaModelOps::RouterScores(Ref<const float> logits, Ref<float> scores, int rows, int experts,
                                kernels::ScoringFunction scoring) {
  Run("RouterScores",
      [&] { return gpu::RouterScores(At(logits), At(scores), rows, experts, scoring); });
}

void CudaModelOps::TopK(Ref<const float> scores, WeightRef selection_bias, int rows, int experts,
                        int k, Ref<int16_t> ids, const kernels::GroupLimit& limit) {
  Run("TopK", [&] {
    return gpu::TopK(At(scores), Weight(selection_bias), rows, experts, k, At(ids), limit);
  });
}

void CudaModelOps::GateWeights(Ref<const float> scores, Ref<const int16_t> ids, int rows,
                               int experts, int k, bool normalize, Ref<float> gates) {
  Run("GateWeights", [&] {
    return gpu::GateWeights(At(scores), At(ids), rows, experts, k, normalize, At(gates));
  });
}

void CudaModelOps::RouterGatesBackward(Ref<const float> logits, Ref<const float> scores,
                                       Ref<const int16_t> ids, Ref<const float> dgates,
                                       Ref<float> dlogits, int rows, int experts, int k,
                                       bool normalize, kernels::ScoringFunction scoring) {
  Run("RouterGatesBackward", [&] {
    return gpu::RouterGatesBackward(At(logits), At(scores), At(ids), At(dgates), At(dlogits), rows,
                                    experts, k, normalize, scoring);
  });
}

ExpertPermutation CudaModelOps::BuildPermutation(Ref<const int16_t> ids, int rows, int k,
                                                 int experts) {
  auto permutation = std::make_shared<gpu::DevicePermutation>();
  ExpertPermutation built{.offsets = std::vector<int>(experts + 1, 0), .rows = rows, .k = k};
  Run("BuildPermutation", [&]() -> absl::Status {
    absl::StatusOr<gpu::DevicePermutation> allocated =
        gpu::DevicePermutation::Allocate(rows, k, experts);
    if (!allocated.ok()) return allocated.status();
    *permutation = *std::move(allocated);
    if (absl::Status status = gpu::BuildPermutation(At(ids), rows, k, experts, *permutation);
        !status.ok()) {
      return status;
    }
    // The host plans with the offsets (the exchange, the grouped projections).
    return gpu::CopyToHost(built.offsets.data(), permutation->offsets.data(),
                           built.offsets.size() * sizeof(int));
  });
  // Staged now, while the device is idle after the copy, for the layer's projections to find.
  if (!Failed()) Staged(staged_ints_, built.offsets);
  built.state = std::move(permutation);
  return built;
}

void CudaModelOps::PermuteRows(Ref<const float> x, const ExpertPermutation& permutation,
                               Ref<float> out, int width) {
  Run("PermuteRows", [&] { return gpu::PermuteRows(At(x), Device(permutation), At(out), width); });
}

void CudaModelOps::PermuteRowsBackward(Ref<const float> dout, const ExpertPermutation& permutation,
                                       Ref<float> dx, int width) {
  Run("PermuteRowsBackward",
      [&] { return gpu::PermuteRowsBackward(At(dout), Device(permutation), At(dx), width); });
}

void CudaModelOps::UnpermuteAdd(Ref<const float> y, const ExpertPermutation& permutation,
                                Ref<const float> gates, Ref<float> out, int width) {
  Run("UnpermuteAdd",
      [&] { return gpu::UnpermuteAdd(At(y), Device(permutation), At(gates), At(out), width); });
}

void CudaModelOps::UnpermuteAddBackward(Ref<const float> y, const ExpertPermutation& permutation,
                                        Ref<const float> gates, Ref<const float> dout,
                                        Ref<float> dy, Ref<float> dgates, int width) {
  Run("UnpermuteAddBackward", [&] {
    return gpu::UnpermuteAddBackward(At(y), Device(permutation), At(gates), At(dout), At(dy),
                                     At(dgates), width);
  });
}

void CudaModelOps::FoldLogSumExp(Ref<const float> logits, Ref<const int> targets, Ref<float> lse,
                                 Ref<float> target_logit, int rows, int first_column, int width) {
  Run("FoldLogSumExp", [&] {
    return gpu::FoldLogSumExp(At(logits), At(targets), At(lse), At(target_logit), rows,
                              first_column, width);
  });
}

void CudaModelOps::TokenLogProbsChunkBackward(Ref<const float> logits, Ref<const int> targets,
                                              Ref<const float> lse, Ref<const float> dlogprob,
                                              Ref<float> dlogits, int rows, int first_column,
                                              int width) {
  Run("TokenLogProbsChunkBackward", [&] {
    return gpu::TokenLogProbsChunkBackward(At(logits), At(targets), At(lse), At(dlogprob),
                                           At(dlogits), rows, first_column, width);
  });
}

void CudaModelOps::Add(Ref<float> target, Ref<const float> values, int64_t n) {
  Run("Add", [&] { return gpu::AddInPlace(At(values), At(target), n); });
}

void CudaModelOps::Scale(Ref<float> x, float factor, int64_t n) {
  Run("Scale", [&] { return gpu::ScaleInPlace(At(x), factor, n); });
}

void CudaModelOps::RoundToBf16(Ref<float> x, int64_t n) {
  Run("RoundToBf16", [&] { return gpu::RoundToBf16(At(x), n); });
}

void CudaModelOps::QuantizeRowsToE4M3(Ref<float> /*x*/, int64_t /*rows*/, int64_t /*width*/) {
  Refuse("QuantizeRowsToE4M3", "no FP8 kernel yet (serve FP8 on the CPU)");
}

void CudaModelOps::CopyColumns(Ref<const float> src, int64_t src_stride, Ref<float> dst,
                               int64_t dst_stride, int64_t rows, int width, bool accumulate) {
  const bool contiguous = (rows == 1 || (src_stride == width && dst_stride == width));
  if (!contiguous) return Refuse("CopyColumns", "strided copies (latent attention) not yet");
  const int64_t n = rows * width;
  if (accumulate) {
    Run("CopyColumns", [&] { return gpu::AddInPlace(At(src), At(dst), n); });
  } else {
    Run("CopyColumns", [&] { return gpu::CopyOnDevice(At(dst), At(src), n * sizeof(float)); });
  }
}

void CudaModelOps::Deinterleave(Ref<float> /*x*/, int /*width*/, int64_t /*count*/) {
  Refuse("Deinterleave", "interleaved rotary pairs (latent attention) not yet");
}

void CudaModelOps::Reinterleave(Ref<float> /*x*/, int /*width*/, int64_t /*count*/) {
  Refuse("Reinterleave", "interleaved rotary pairs (latent attention) not yet");
}

}  // namespace tandem::engine::cuda
