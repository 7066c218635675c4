#ifndef TANDEM_TRANSFER_LORA_TESTING_H_
#define TANDEM_TRANSFER_LORA_TESTING_H_

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "tandem/weightstore/v1/weight_store.pb.h"
#include "transfer/lora_layout.h"

namespace tandem::transfer {

// A complete adapter version as a trainer with TP x EP ranks would publish it: the manifest,
// each rank's shard bytes, and the canonical tensors for checking what consumers assemble.
struct TestAdapter {
  weightstore::v1::Manifest manifest;
  std::vector<std::string> shards;
  absl::flat_hash_map<std::string, std::string> canonical;

  std::vector<absl::string_view> shard_views() const { return {shards.begin(), shards.end()}; }
};

// The tiny model of the layout tests: every TP and EP size in {1, 2, 4} divides its split
// dimensions and its expert count.
inline constexpr ModelShape kTinyModel{.num_layers = 3,
                                       .num_dense_layers = 1,
                                       .hidden = 8,
                                       .q_out = 8,
                                       .kv_out = 4,
                                       .dense_ffn = 12,
                                       .expert_ffn = 4,
                                       .num_experts = 4};

// Seeded random bytes for every canonical tensor (for "{e}" tensors the E tensors stacked).
inline absl::flat_hash_map<std::string, std::string> RandomCanonicalBytes(
    const std::vector<weightstore::v1::CanonicalTensor>& tensors, uint64_t seed) {
  std::mt19937_64 random(seed);
  absl::flat_hash_map<std::string, std::string> canonical;
  for (const weightstore::v1::CanonicalTensor& tensor : tensors) {
    int64_t size = ElementSize(tensor.spec().dtype()) * std::max(tensor.num_experts(), 1);
    for (int64_t dim : tensor.spec().shape()) size *= dim;
    std::string& data = canonical[tensor.spec().name()];
    data.resize(size);
    for (size_t i = 0; i < data.size(); i += 8) {
      const uint64_t word = random();
      std::memcpy(data.data() + i, &word, std::min<size_t>(8, data.size() - i));
    }
  }
  return canonical;
}

// The producer and model of a test adapter; the defaults are tiny, a benchmark scales them.
struct TestAdapterSpec {
  int tp_size = 2;
  int ep_size = 2;
  ModelShape model = kTinyModel;
  int rank = 4;
};

// A producer at TP 2 x EP 2 and rank 16 of DeepSeek-like layers (about 2.5 MiB of LoRA each),
// as many as make about `mib` MiB (one layer below 2 MiB).
inline TestAdapterSpec TestAdapterSpecOfSize(double mib) {
  TestAdapterSpec spec{.tp_size = 2, .ep_size = 2, .rank = 16};
  spec.model = {.num_layers = std::max(1, static_cast<int>(mib / 2.57 + 0.5)),
                .num_dense_layers = 1,
                .hidden = 1024,
                .q_out = 1024,
                .kv_out = 256,
                .dense_ffn = 2048,
                .expert_ffn = 512,
                .num_experts = 16};
  if (mib < 2) spec.model.num_layers = 1;
  return spec;
}

inline TestAdapter MakeTestAdapter(const std::string& name, int64_t version, uint64_t seed,
                                   const TestAdapterSpec& spec = {}) {
  const ModelShape& model = spec.model;
  const int tp_size = spec.tp_size;
  const int ep_size = spec.ep_size;
  type::v1::LoraConfig lora;
  lora.set_rank(spec.rank);
  lora.set_alpha(8);
  lora.set_expert_layout(type::v1::EXPERT_LAYOUT_PER_EXPERT);
  TestAdapter adapter;
  std::vector<weightstore::v1::CanonicalTensor> tensors =
      *CanonicalTensorsFor(model, lora, type::v1::DTYPE_BF16);
  adapter.canonical = RandomCanonicalBytes(tensors, seed);
  weightstore::v1::Manifest& manifest = adapter.manifest;
  manifest.set_adapter_name(name);
  manifest.set_version(version);
  *manifest.mutable_lora() = lora;
  manifest.mutable_tensors()->Add(tensors.begin(), tensors.end());
  for (int tp = 0; tp < tp_size; ++tp) {
    for (int ep = 0; ep < ep_size; ++ep) {
      auto [shard, bytes] = *BuildProducerShard(
          tensors, adapter.canonical,
          {.tp_rank = tp, .tp_size = tp_size, .ep_rank = ep, .ep_size = ep_size},
          tp * ep_size + ep);
      if (shard.byte_size() == 0) continue;
      *manifest.add_shards() = std::move(shard);
      adapter.shards.push_back(std::move(bytes));
    }
  }
  return adapter;
}

// The name a stacked-experts target uses for a canonical tensor: ".{e}" dropped.
inline std::string StackedName(std::string name) {
  if (const size_t at = name.find(".{e}"); at != std::string::npos) name.erase(at, 4);
  return name;
}

}  // namespace tandem::transfer

#endif  // TANDEM_TRANSFER_LORA_TESTING_H_
