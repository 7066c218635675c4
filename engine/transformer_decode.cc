// Transformer as a DecodeEngine: key/value caches in the operations' memory and the attention
// backends that fill and read them.

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/transformer.h"

namespace tandem::engine {
namespace {

// Per layer [positions, key_width] keys and [positions, value_width] values, in the memory of the
// transformer's operations.
struct BufferSequenceCache : SequenceCache {
  std::vector<Buffer<float>> keys, values;
};

BufferSequenceCache& CacheOf(SequenceCache& cache) {
  return static_cast<BufferSequenceCache&>(cache);
}

// Prompt rows of one sequence: causal attention among them, caching their keys and values.
class PrefillAttention : public AttentionBackend {
 public:
  PrefillAttention(ModelOps& ops, BufferSequenceCache& cache, int rows, const ModelConfig& config)
      : ops_(ops), cache_(cache), rows_(rows), config_(config) {}

  void Attend(int layer, Ref<const float> q, Ref<const float> k, Ref<const float> v,
              Ref<float> out) override {
    ops_.Copy(k, cache_.keys[layer].ref(), int64_t{rows_} * config_.key_width());
    ops_.Copy(v, cache_.values[layer].ref(), int64_t{rows_} * config_.value_width());
    ops_.Resize(probs_, int64_t{config_.num_heads} * rows_ * rows_);
    ops_.CausalAttention(q, k, v, out, probs_.ref(), rows_, config_.attention_shape());
  }

 private:
  ModelOps& ops_;
  BufferSequenceCache& cache_;
  const int rows_;
  const ModelConfig& config_;
  Buffer<float> probs_;
};

// One row per sequence: append its key/value to the cache, attend over the cache.
class DecodeAttention : public AttentionBackend {
 public:
  DecodeAttention(ModelOps& ops, const int* positions, const std::vector<SequenceCache*>& caches,
                  const ModelConfig& config)
      : ops_(ops), positions_(positions), caches_(caches), config_(config) {}

  void Attend(int layer, Ref<const float> q, Ref<const float> k, Ref<const float> v,
              Ref<float> out) override {
    const cpu::AttentionShape shape = config_.attention_shape();
    const int q_width = config_.query_width(), out_width = config_.attention_out_dim();
    const int k_width = config_.key_width(), v_width = config_.value_width();
    for (size_t row = 0; row < caches_.size(); ++row) {
      BufferSequenceCache& cache = CacheOf(*caches_[row]);
      const int position = positions_[row];
      ops_.Copy(k + row * k_width, cache.keys[layer].ref() + int64_t{position} * k_width, k_width);
      ops_.Copy(v + row * v_width, cache.values[layer].ref() + int64_t{position} * v_width,
                v_width);
      ops_.DecodeAttention(q + row * q_width, cache.keys[layer].ref(), cache.values[layer].ref(),
                           position + 1, out + row * out_width, shape);
    }
  }

 private:
  ModelOps& ops_;
  const int* positions_;
  const std::vector<SequenceCache*>& caches_;
  const ModelConfig& config_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SequenceCache>> Transformer::NewCache(int positions) {
  auto cache = std::make_unique<BufferSequenceCache>();
  for (int layer = 0; layer < config_.num_layers; ++layer) {
    cache->keys.push_back(ops_->Zeros(int64_t{positions} * config_.key_width()));
    cache->values.push_back(ops_->Zeros(int64_t{positions} * config_.value_width()));
  }
  if (absl::Status status = ops_->Finish(); !status.ok()) return status;  // Out of memory.
  return cache;
}

absl::Status Transformer::Prefill(const std::vector<PromptToPrefill>& prompts, float* last_logits,
                                  int16_t* routes) {
  const int vocab = config_.vocab_size;
  const int64_t route_row = int64_t{config_.num_moe_layers()} * config_.top_k;
  for (size_t s = 0; s < prompts.size(); ++s) {
    const BufferSequenceCache& cache = CacheOf(*prompts[s].cache);
    const int64_t capacity =
        cache.keys.empty() ? 0 : static_cast<int64_t>(cache.keys.front().size()) / config_.key_width();
    if (prompts[s].length < 1 || prompts[s].length > capacity) {
      return absl::InvalidArgumentError(absl::StrCat("prompt ", s, " of ", prompts[s].length,
                                                     " tokens for a cache of ", capacity,
                                                     " positions"));
    }
  }
  std::vector<int> positions;
  std::vector<float> logits;
  for (const PromptToPrefill& prompt : prompts) {
    const int rows = prompt.length;
    positions.resize(rows);
    for (int t = 0; t < rows; ++t) positions[t] = t;
    logits.resize(static_cast<size_t>(rows) * vocab);
    PrefillAttention attention(*ops_, CacheOf(*prompt.cache), rows, config_);
    if (absl::Status status =
            ForwardRows(prompt.tokens, positions.data(), rows, attention, logits.data(), routes);
        !status.ok()) {
      return status;
    }
    last_logits = std::copy_n(logits.data() + int64_t{rows - 1} * vocab, vocab, last_logits);
    if (routes != nullptr) routes += rows * route_row;
  }
  return absl::OkStatus();
}

absl::Status Transformer::Decode(const int* tokens, const int* positions,
                                 const std::vector<SequenceCache*>& caches, float* logits,
                                 int16_t* routes) {
  DecodeAttention attention(*ops_, positions, caches, config_);
  return ForwardRows(tokens, positions, static_cast<int>(caches.size()), attention, logits, routes);
}

}  // namespace tandem::engine
