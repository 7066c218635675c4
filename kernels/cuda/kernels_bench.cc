// Throughput of the CUDA kernels against yardsticks measured in the same run: memory-bound
// kernels as a fraction of a device-to-device copy's bandwidth (counting the bytes each kernel
// must move at least), the grouped GEMMs and grouped LoRA as a fraction of cuBLAS on the same
// shapes (sgemm per expert for fp32; one dense bf16 GEMM of the same FLOPs for the tensor cores,
// with cuBLAS's own per-expert and grouped bf16 calls beside it). Prints one table; needs a GPU
// (tools/gpu_check run).

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cublas_reference.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/grouped_lora.h"
#include "kernels/cuda/loss.h"
#include "kernels/cuda/permute.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/router.h"
#include "kernels/cuda/swiglu.h"

namespace tandem::cuda {
namespace {

constexpr int kIterations = 20;

[[noreturn]] void Fail(const absl::Status& status) {
  std::fprintf(stderr, "kernels_bench: %s\n", status.ToString().c_str());
  std::exit(1);
}

template <typename T>
DeviceArray<T> Filled(size_t n, T value) {
  absl::StatusOr<DeviceArray<T>> array = DeviceArray<T>::FromHost(std::vector<T>(n, value));
  if (!array.ok()) Fail(array.status());
  return *std::move(array);
}

template <typename T>
DeviceArray<T> FromHost(const std::vector<T>& host) {
  absl::StatusOr<DeviceArray<T>> array = DeviceArray<T>::FromHost(host);
  if (!array.ok()) Fail(array.status());
  return *std::move(array);
}

double Time(const std::function<absl::Status()>& launch) {
  absl::StatusOr<double> ms = TimeMilliseconds(launch, kIterations);
  if (!ms.ok()) Fail(ms.status());
  return *ms;
}

class Table {
 public:
  void SetCopyBandwidth(double gbps) { copy_gbps_ = gbps; }

  // A memory-bound kernel: `bytes` is the traffic it cannot avoid.
  void Memory(const std::string& kernel, const std::string& shape, double bytes,
              const std::function<absl::Status()>& launch) {
    const double ms = Time(launch);
    const double gbps = bytes / ms / 1e6;
    std::printf("%-24s %-36s %9.3f ms %10.1f GB/s     %5.1f%% of copy\n", kernel.c_str(),
                shape.c_str(), ms, gbps, 100.0 * gbps / copy_gbps_);
  }

  // A compute-bound kernel against a reference doing the same FLOPs (reference_ms <= 0: none).
  void Compute(const std::string& kernel, const std::string& shape, double flops, double ms,
               double reference_ms, const char* reference) {
    std::printf("%-24s %-36s %9.3f ms %10.2f TFLOP/s", kernel.c_str(), shape.c_str(), ms,
                flops / ms / 1e9);
    if (reference_ms > 0) std::printf("  %5.1f%% of %s", 100.0 * reference_ms / ms, reference);
    std::printf("\n");
  }

 private:
  double copy_gbps_ = 1.0;
};

void CopyReference(Table& table) {
  constexpr size_t kFloats = size_t{1} << 28;  // 1 GiB each way.
  DeviceArray<float> from = Filled(kFloats, 0.0f), to = Filled(kFloats, 0.0f);
  const double ms = Time([&] { return CopyOnDevice(to.data(), from.data(), kFloats * 4); });
  const double gbps = 2.0 * kFloats * 4 / ms / 1e6;
  table.SetCopyBandwidth(gbps);
  std::printf("%-24s %-36s %9.3f ms %10.1f GB/s     (the yardstick)\n", "device copy", "1 GiB", ms,
              gbps);
}

void ElementwiseKernels(Table& table) {
  constexpr int64_t kN = int64_t{1} << 26;
  DeviceArray<float> a = Filled(kN, 0.5f), b = Filled(kN, 0.5f), c = Filled(kN, 0.5f);
  DeviceArray<float> d = Filled(kN, 0.5f), e = Filled(kN, 0.5f);
  const std::string shape = absl::StrCat(kN, " floats");
  table.Memory("SwiGlu", shape, 3.0 * kN * 4,
               [&] { return SwiGlu(a.data(), b.data(), c.data(), kN); });
  table.Memory("SwiGluBackward", shape, 7.0 * kN * 4, [&] {
    return SwiGluBackward(a.data(), b.data(), c.data(), d.data(), e.data(), kN);
  });
  const cpu::AdamWStep step = cpu::AdamWStep::For(1e-3f, 1, 0.9f, 0.999f, 1e-8f, 0.01f);
  table.Memory("AdamWUpdate", shape, 7.0 * kN * 4, [&] {
    return cuda::AdamWUpdate(a.data(), b.data(), c.data(), d.data(), kN, true, step);
  });
}

void RowKernels(Table& table) {
  constexpr int kRows = 16384, kDim = 4096;
  const size_t n = size_t{kRows} * kDim;
  DeviceArray<float> x = Filled(n, 0.5f), y = Filled(n, 0.0f), dy = Filled(n, 0.5f);
  DeviceArray<float> w = Filled(kDim, 1.0f), rstd = Filled(kRows, 1.0f), dw = Filled(kDim, 0.0f);
  const std::string rows = absl::StrCat(kRows, " x ", kDim);
  table.Memory("RmsNorm", rows, 2.0 * n * 4, [&] {
    return RmsNorm(x.data(), w.data(), y.data(), rstd.data(), kRows, kDim, 1e-6f);
  });
  table.Memory("RmsNormBackward", rows, 4.0 * n * 4, [&] {
    return RmsNormBackward(x.data(), w.data(), rstd.data(), dy.data(), y.data(), dw.data(), kRows,
                           kDim);
  });
  std::vector<int> ids(kRows), positions(kRows);
  for (int r = 0; r < kRows; ++r) {
    ids[r] = (r * 7919) % 32768;
    positions[r] = r;
  }
  DeviceArray<int> ids_d = FromHost(ids), positions_d = FromHost(positions);
  DeviceArray<float> embeddings = Filled(size_t{32768} * kDim, 0.5f);
  table.Memory("EmbeddingGather", rows, 2.0 * n * 4, [&] {
    return EmbeddingGather(embeddings.data(), ids_d.data(), y.data(), kRows, kDim);
  });
  absl::StatusOr<DeviceRopeFrequencies> rope =
      DeviceRopeFrequencies::Upload(cpu::RopeFrequencies::Plain(10000.0, 128));
  if (!rope.ok()) Fail(rope.status());
  table.Memory("Rope", absl::StrCat(kRows, " tokens x 32 heads x 128"), 2.0 * n * 4,
               [&] { return Rope(x.data(), positions_d.data(), kRows, 32, *rope); });
}

void LossKernels(Table& table) {
  constexpr int kRows = 2048, kVocab = 151936;
  const size_t n = size_t{kRows} * kVocab;
  DeviceArray<float> logits = Filled(n, 0.5f), dlogits = Filled(n, 0.0f);
  DeviceArray<float> out = Filled(kRows, 0.0f), dlogp = Filled(kRows, 1.0f);
  DeviceArray<int> targets = Filled(kRows, 17);
  const std::string shape = absl::StrCat(kRows, " x ", kVocab);
  table.Memory("LogSoftmax", shape, 2.0 * n * 4,
               [&] { return LogSoftmax(logits.data(), dlogits.data(), kRows, kVocab); });
  table.Memory("TokenLogProbs", shape, 1.0 * n * 4, [&] {
    return TokenLogProbs(logits.data(), targets.data(), out.data(), nullptr, kRows, kVocab);
  });
  table.Memory("TokenLogProbsBackward", shape, 3.0 * n * 4, [&] {
    return TokenLogProbsBackward(logits.data(), targets.data(), dlogp.data(), dlogits.data(), kRows,
                                 kVocab);
  });
}

// DeepSeek-V3-like routing: 256 experts, k = 8, 8 groups keeping 4, a selection bias.
void RouterAndDispatch(Table& table) {
  constexpr int kTokens = 16384, kExperts = 256, kK = 8, kWidth = 2048;
  std::vector<float> logits(size_t{kTokens} * kExperts);
  for (size_t i = 0; i < logits.size(); ++i)
    logits[i] = static_cast<float>((i * 2654435761u) % 1000) / 250.0f;
  DeviceArray<float> logits_d = FromHost(logits), scores = Filled(logits.size(), 0.0f);
  DeviceArray<float> bias = Filled(kExperts, 0.01f);
  DeviceArray<int16_t> ids = Filled<int16_t>(size_t{kTokens} * kK, 0);
  const std::string shape = absl::StrCat(kTokens, " tokens, ", kExperts, " experts, k ", kK);
  table.Memory("RouterScores (sigmoid)", shape, 2.0 * logits.size() * 4, [&] {
    return cuda::RouterScores(logits_d.data(), scores.data(), kTokens, kExperts,
                              kernels::ScoringFunction::kSigmoid);
  });
  table.Memory("TopK (4 of 8 groups)", shape, logits.size() * 4.0 + ids.size() * 2.0, [&] {
    return cuda::TopK(scores.data(), bias.data(), kTokens, kExperts, kK, ids.data(), {8, 4});
  });
  absl::StatusOr<DevicePermutation> permutation =
      DevicePermutation::Allocate(kTokens, kK, kExperts);
  if (!permutation.ok()) Fail(permutation.status());
  table.Memory("BuildPermutation", shape, ids.size() * 2.0 + ids.size() * 8.0,
               [&] { return BuildPermutation(ids.data(), kTokens, kK, kExperts, *permutation); });
  const size_t rows = size_t{kTokens} * kK;
  DeviceArray<float> x = Filled(size_t{kTokens} * kWidth, 0.5f);
  DeviceArray<float> permuted = Filled(rows * kWidth, 0.0f), gates = Filled(rows, 0.125f);
  const std::string rows_shape = absl::StrCat(rows, " rows x ", kWidth);
  table.Memory("PermuteRows", rows_shape, 2.0 * rows * kWidth * 4,
               [&] { return PermuteRows(x.data(), *permutation, permuted.data(), kWidth); });
  table.Memory("UnpermuteAdd", rows_shape, (rows + 2.0 * kTokens) * kWidth * 4, [&] {
    return UnpermuteAdd(permuted.data(), *permutation, gates.data(), x.data(), kWidth);
  });
}

// 64 experts of 512 rows each; the reference runs one cuBLAS sgemm per expert.
constexpr int kGroups = 64, kRowsPerGroup = 512, kIn = 2048, kOut = 1024, kRank = 16;
constexpr int kRows = kGroups * kRowsPerGroup;

// cuBLAS's own ways to run the experts' bf16 products, against one dense GEMM of the same
// FLOPs: a cublasGemmEx per expert, and every expert in one cublasGemmGroupedBatchedEx.
void CublasBf16Candidates(Table& table, CublasReference& cublas, const std::string& shape,
                          const uint16_t* x16, const uint16_t* w16, float* y, double dense_ms) {
  const double flops = 2.0 * kRows * kIn * kOut;
  const double per_expert_ms = Time([&] {
    for (int g = 0; g < kGroups; ++g) {
      absl::Status status = cublas.MatmulTransposedBf16(
          x16 + int64_t{g} * kRowsPerGroup * kIn, w16 + int64_t{g} * kOut * kIn,
          y + int64_t{g} * kRowsPerGroup * kOut, kRowsPerGroup, kOut, kIn);
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  });
  table.Compute("cuBLAS bf16 per expert", shape, flops, per_expert_ms, dense_ms,
                "cuBLAS bf16 dense");
  DeviceArray<uint16_t> y16 = Filled<uint16_t>(size_t{kRows} * kOut, 0);
  std::vector<const uint16_t*> a(kGroups), b(kGroups);
  std::vector<uint16_t*> c(kGroups);
  for (int g = 0; g < kGroups; ++g) {
    a[g] = x16 + int64_t{g} * kRowsPerGroup * kIn;
    b[g] = w16 + int64_t{g} * kOut * kIn;
    c[g] = y16.data() + int64_t{g} * kRowsPerGroup * kOut;
  }
  DeviceArray<const uint16_t*> a_d = FromHost(a), b_d = FromHost(b);
  DeviceArray<uint16_t*> c_d = FromHost(c);
  const std::vector<int> rows(kGroups, kRowsPerGroup);
  absl::Status probe =
      cublas.GroupedMatmulTransposedBf16(rows, kOut, kIn, a_d.data(), b_d.data(), c_d.data());
  if (!probe.ok()) {
    std::printf("cuBLAS grouped bf16: %s\n", probe.ToString().c_str());
    return;
  }
  const double grouped_ms = Time([&] {
    return cublas.GroupedMatmulTransposedBf16(rows, kOut, kIn, a_d.data(), b_d.data(), c_d.data());
  });
  table.Compute("cuBLAS grouped bf16", shape, flops, grouped_ms, dense_ms, "cuBLAS bf16 dense");
}

void GroupedGemms(Table& table, CublasReference* cublas) {
  std::vector<int> offsets(kGroups + 1);
  for (int g = 0; g <= kGroups; ++g) offsets[g] = g * kRowsPerGroup;
  DeviceArray<int> offsets_d = FromHost(offsets);
  DeviceArray<float> x = Filled(size_t{kRows} * kIn, 0.01f);
  DeviceArray<float> w = Filled(size_t{kGroups} * kOut * kIn, 0.01f);
  DeviceArray<float> y = Filled(size_t{kRows} * kOut, 0.0f);
  const std::string shape =
      absl::StrCat(kGroups, " x [", kRowsPerGroup, " x ", kIn, "]·[", kOut, " x ", kIn, "]ᵀ");
  const RowGroupedGemm gemm{.a = x.data(),
                            .lda = kIn,
                            .w = w.data(),
                            .w_group_stride = int64_t{kOut} * kIn,
                            .ldw = kIn,
                            .transpose_w = true,
                            .c = y.data(),
                            .ldc = kOut,
                            .n = kOut,
                            .k = kIn};
  const double ms = Time([&] { return GroupedGemm(gemm, offsets_d.data(), kGroups, kRows); });
  const auto per_expert = [&](int in, int out, const float* a, const float* b, float* c,
                              int64_t b_stride) {
    return [=] {
      for (int g = 0; g < kGroups; ++g) {
        absl::Status status =
            cublas->MatmulTransposed(a + int64_t{g} * kRowsPerGroup * in, b + g * b_stride,
                                     c + int64_t{g} * kRowsPerGroup * out, kRowsPerGroup, out, in);
        if (!status.ok()) return status;
      }
      return absl::OkStatus();
    };
  };
  const double reference_ms =
      cublas == nullptr
          ? 0.0
          : Time(per_expert(kIn, kOut, x.data(), w.data(), y.data(), int64_t{kOut} * kIn));
  table.Compute("GroupedGemm x·Wᵀ", shape, 2.0 * kRows * kIn * kOut, ms, reference_ms,
                "cuBLAS per expert");
  // The tensor cores, against one dense cuBLAS bf16 GEMM of the same FLOPs (all experts'
  // rows through one weight): what the grouping costs.
  const double bf16_ms =
      Time([&] { return GroupedGemmBf16(gemm, offsets_d.data(), kGroups, kRows); });
  double dense_bf16_ms = 0.0;
  if (cublas != nullptr) {
    const uint16_t bf16_bits = ToBFloat16(0.01f).bits;
    DeviceArray<uint16_t> x16 = Filled<uint16_t>(size_t{kRows} * kIn, bf16_bits);
    DeviceArray<uint16_t> w16 = Filled<uint16_t>(size_t{kGroups} * kOut * kIn, bf16_bits);
    dense_bf16_ms = Time([&] {
      return cublas->MatmulTransposedBf16(x16.data(), w16.data(), y.data(), kRows, kOut, kIn);
    });
    CublasBf16Candidates(table, *cublas, shape, x16.data(), w16.data(), y.data(), dense_bf16_ms);
  }
  table.Compute("GroupedGemmBf16 x·Wᵀ", shape, 2.0 * kRows * kIn * kOut, bf16_ms, dense_bf16_ms,
                "cuBLAS bf16 dense");

  DeviceArray<float> a = Filled(size_t{kGroups} * kRank * kIn, 0.01f);
  DeviceArray<float> b = Filled(size_t{kGroups} * kOut * kRank, 0.01f);
  DeviceArray<float> h = Filled(size_t{kRows} * kRank, 0.0f);
  const kernels::GroupedLoraWeights lora{
      a.data(), b.data(), int64_t{kRank} * kIn, int64_t{kOut} * kRank, kRank, 2.0f};
  const double lora_ms = Time([&] {
    return cuda::GroupedLoraForward(x.data(), offsets_d.data(), kGroups, kRows, kIn, kOut, lora,
                                    h.data(), y.data());
  });
  double lora_reference_ms = 0.0;
  if (cublas != nullptr) {
    const auto shrink = per_expert(kIn, kRank, x.data(), a.data(), h.data(), int64_t{kRank} * kIn);
    const auto expand =
        per_expert(kRank, kOut, h.data(), b.data(), y.data(), int64_t{kOut} * kRank);
    lora_reference_ms = Time([&] {
      absl::Status status = shrink();
      return status.ok() ? expand() : status;
    });
  }
  table.Compute("GroupedLoraForward", absl::StrCat(shape, " r", kRank),
                2.0 * kRows * kRank * (kIn + kOut), lora_ms, lora_reference_ms,
                "cuBLAS per expert");
}

// Decode's expert projections: 32 experts of 4 rows each, bound by reading the weights (the
// traffic counted is W's bytes, plus the LoRA's for GroupedLoraForward).
void DecodeGroupedGemms(Table& table) {
  constexpr int kExperts = 32, kRowsPerExpert = 4, kWidth = 1024, kRank = 16;
  constexpr int kDecodeRows = kExperts * kRowsPerExpert;
  std::vector<int> offsets(kExperts + 1);
  for (int g = 0; g <= kExperts; ++g) offsets[g] = g * kRowsPerExpert;
  DeviceArray<int> offsets_d = FromHost(offsets);
  DeviceArray<float> x = Filled(size_t{kDecodeRows} * kWidth, 0.01f);
  DeviceArray<float> w = Filled(size_t{kExperts} * kWidth * kWidth, 0.01f);
  DeviceArray<float> y = Filled(size_t{kDecodeRows} * kWidth, 0.0f);
  const std::string shape = absl::StrCat(kExperts, " x [", kRowsPerExpert, " x ", kWidth, "]·[",
                                         kWidth, " x ", kWidth, "]ᵀ");
  const RowGroupedGemm gemm{.a = x.data(),
                            .lda = kWidth,
                            .w = w.data(),
                            .w_group_stride = int64_t{kWidth} * kWidth,
                            .ldw = kWidth,
                            .transpose_w = true,
                            .c = y.data(),
                            .ldc = kWidth,
                            .n = kWidth,
                            .k = kWidth};
  const double weight_bytes = 4.0 * kExperts * kWidth * kWidth;
  table.Memory("GroupedGemm (decode)", shape, weight_bytes,
               [&] { return GroupedGemm(gemm, offsets_d.data(), kExperts, kDecodeRows); });
  DeviceArray<float> a = Filled(size_t{kExperts} * kRank * kWidth, 0.01f);
  DeviceArray<float> b = Filled(size_t{kExperts} * kWidth * kRank, 0.01f);
  DeviceArray<float> h = Filled(size_t{kDecodeRows} * kRank, 0.0f);
  const kernels::GroupedLoraWeights lora{
      a.data(), b.data(), int64_t{kRank} * kWidth, int64_t{kWidth} * kRank, kRank, 2.0f};
  table.Memory("GroupedLoraForward (decode)", absl::StrCat(shape, " r", kRank),
               2.0 * 4 * kExperts * kRank * kWidth, [&] {
                 return cuda::GroupedLoraForward(x.data(), offsets_d.data(), kExperts, kDecodeRows,
                                                 kWidth, kWidth, lora, h.data(), y.data());
               });
}

void AttentionKernels(Table& table) {
  constexpr int kTokens = 2048, kHeads = 16, kKvHeads = 4, kDim = 128, kCache = 8192;
  const kernels::AttentionShape shape = kernels::AttentionShape::Standard(kHeads, kKvHeads, kDim);
  DeviceArray<float> q = Filled(size_t{kTokens} * kHeads * kDim, 0.01f);
  DeviceArray<float> k = Filled(size_t{kCache} * kKvHeads * kDim, 0.01f);
  DeviceArray<float> v = Filled(size_t{kCache} * kKvHeads * kDim, 0.01f);
  DeviceArray<float> out = Filled(size_t{kTokens} * kHeads * kDim, 0.0f);
  DeviceArray<float> probs = Filled(size_t{kHeads} * kTokens * kTokens, 0.0f);
  const double ms = Time([&] {
    return cuda::CausalAttention(q.data(), k.data(), v.data(), out.data(), probs.data(), kTokens,
                                 shape);
  });
  // Causal: half of the T² scores, two GEMM-like products of D each.
  table.Compute("CausalAttention",
                absl::StrCat(kTokens, " tokens, ", kHeads, "/", kKvHeads, " heads x ", kDim),
                2.0 * kHeads * kTokens * kTokens * kDim, ms, 0.0, "");
  DeviceArray<float> scratch = Filled(size_t{kHeads} * kCache, 0.0f);
  table.Memory("DecodeAttention",
               absl::StrCat(kCache, " cached, ", kHeads, "/", kKvHeads, " heads x ", kDim),
               2.0 * kCache * kKvHeads * kDim * 4, [&] {
                 return cuda::DecodeAttention(q.data(), k.data(), v.data(), kCache, out.data(),
                                              shape, scratch.data());
               });
}

int Run() {
  if (VisibleDeviceCount() == 0) {
    std::printf("kernels_bench: SKIPPED, no GPU visible\n");
    return 0;
  }
  absl::StatusOr<DeviceInfo> device = SelectDevice(0);
  if (!device.ok()) Fail(device.status());
  std::printf("%s, compute capability %d.%d, %d SMs, %.1f GiB\n", device->name.c_str(),
              device->compute_major, device->compute_minor, device->multiprocessors,
              device->total_bytes / double{1 << 30});
  absl::StatusOr<std::unique_ptr<CublasReference>> cublas = CublasReference::Load();
  if (!cublas.ok()) std::printf("no cuBLAS reference: %s\n", cublas.status().ToString().c_str());
  Table table;
  CopyReference(table);
  ElementwiseKernels(table);
  RowKernels(table);
  LossKernels(table);
  RouterAndDispatch(table);
  GroupedGemms(table, cublas.ok() ? cublas->get() : nullptr);
  DecodeGroupedGemms(table);
  AttentionKernels(table);
  return 0;
}

}  // namespace
}  // namespace tandem::cuda

int main() { return tandem::cuda::Run(); }
