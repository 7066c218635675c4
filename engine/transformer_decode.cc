// Transformer as a DecodeEngine: key/value caches in the operations' memory and the attention
// backends that fill and read them.

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
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

// The rows of one or more prompts, packed in order: causal attention within each prompt, caching
// its keys and values.
class PrefillAttention : public AttentionBackend {
 public:
  PrefillAttention(ModelOps& ops, absl::Span<const PromptToPrefill> prompts,
                   const ModelConfig& config)
      : ops_(ops), prompts_(prompts), config_(config) {
    int longest = 0;
    for (const PromptToPrefill& prompt : prompts) longest = std::max(longest, prompt.length);
    ops_.Resize(probs_, int64_t{config_.num_heads} * longest * longest);
  }

  void Attend(int layer, Ref<const float> q, Ref<const float> k, Ref<const float> v,
              Ref<float> out) override {
    const int q_width = config_.query_width(), out_width = config_.attention_out_dim();
    const int k_width = config_.key_width(), v_width = config_.value_width();
    int64_t row = 0;
    for (const PromptToPrefill& prompt : prompts_) {
      BufferSequenceCache& cache = CacheOf(*prompt.cache);
      const int rows = prompt.length;
      ops_.Copy(k + row * k_width, cache.keys[layer].ref(), int64_t{rows} * k_width);
      ops_.Copy(v + row * v_width, cache.values[layer].ref(), int64_t{rows} * v_width);
      ops_.CausalAttention(q + row * q_width, k + row * k_width, v + row * v_width,
                           out + row * out_width, probs_.ref(), rows, config_.attention_shape());
      row += rows;
    }
  }

 private:
  ModelOps& ops_;
  const absl::Span<const PromptToPrefill> prompts_;
  const ModelConfig& config_;
  Buffer<float> probs_;
};

// One row per sequence: each row's key and value join its cache, then it attends over the cache.
class DecodeAttention : public AttentionBackend {
 public:
  DecodeAttention(ModelOps& ops, const int* positions, const std::vector<SequenceCache*>& caches,
                  const ModelConfig& config)
      : ops_(ops), positions_(positions), caches_(caches), config_(config) {}

  void Attend(int layer, Ref<const float> q, Ref<const float> k, Ref<const float> v,
              Ref<float> out) override {
    keys_.clear();
    values_.clear();
    for (SequenceCache* cache : caches_) {
      keys_.push_back(CacheOf(*cache).keys[layer].ref());
      values_.push_back(CacheOf(*cache).values[layer].ref());
    }
    ops_.AppendAndAttend(q, k, v, keys_, values_, positions_, out, config_.attention_shape());
  }

 private:
  ModelOps& ops_;
  const int* positions_;
  const std::vector<SequenceCache*>& caches_;
  const ModelConfig& config_;
  std::vector<Ref<float>> keys_, values_;
};

// Positions `cache` holds.
int64_t Capacity(const BufferSequenceCache& cache, const ModelConfig& config) {
  return cache.keys.empty() ? 0 : cache.keys.front().size() / config.key_width();
}

absl::Status CheckTokens(const int* tokens, int count, int vocab, const char* what, size_t index) {
  for (int t = 0; t < count; ++t) {
    if (tokens[t] < 0 || tokens[t] >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", index, ": token ", tokens[t], " outside [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SequenceCache>> Transformer::NewCache(int positions) {
  if (positions < 1 || positions > config_.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a cache of ", positions, " positions; the model holds 1 to ", config_.max_seq_len));
  }
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
    const int64_t capacity = Capacity(CacheOf(*prompts[s].cache), config_);
    if (prompts[s].length < 1 || prompts[s].length > capacity) {
      return absl::InvalidArgumentError(absl::StrCat("prompt ", s, " of ", prompts[s].length,
                                                     " tokens for a cache of ", capacity,
                                                     " positions"));
    }
    if (absl::Status status = CheckTokens(prompts[s].tokens, prompts[s].length, vocab, "prompt", s);
        !status.ok()) {
      return status;
    }
  }
  // On the host a pass per prompt, on a device one pass for all (see the header).
  const size_t per_pass = ops_->capabilities().host_memory ? 1 : prompts.size();
  std::vector<int> tokens, positions, last_rows;
  for (size_t first = 0; first < prompts.size(); first += per_pass) {
    const absl::Span<const PromptToPrefill> pass =
        absl::MakeConstSpan(prompts).subspan(first, per_pass);
    tokens.clear();
    positions.clear();
    for (const PromptToPrefill& prompt : pass) {
      tokens.insert(tokens.end(), prompt.tokens, prompt.tokens + prompt.length);
      for (int t = 0; t < prompt.length; ++t) positions.push_back(t);
    }
    last_rows.clear();
    for (const PromptToPrefill& prompt : pass) {
      last_rows.push_back((last_rows.empty() ? -1 : last_rows.back()) + prompt.length);
    }
    const int rows = static_cast<int>(tokens.size());
    PrefillAttention attention(*ops_, pass, config_);
    if (absl::Status status = ForwardRows(tokens.data(), positions.data(), rows, attention,
                                          last_logits, routes, last_rows);
        !status.ok()) {
      return status;
    }
    last_logits += pass.size() * vocab;
    if (routes != nullptr) routes += rows * route_row;
  }
  return absl::OkStatus();
}

absl::Status Transformer::Decode(const int* tokens, const int* positions,
                                 const std::vector<SequenceCache*>& caches, float* logits,
                                 int16_t* routes) {
  for (size_t row = 0; row < caches.size(); ++row) {
    const int64_t capacity = Capacity(CacheOf(*caches[row]), config_);
    if (positions[row] < 0 || positions[row] >= capacity) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", row, " decodes position ",
                                                     positions[row], " in a cache of ", capacity,
                                                     " positions"));
    }
    if (absl::Status status = CheckTokens(&tokens[row], 1, config_.vocab_size, "sequence", row);
        !status.ok()) {
      return status;
    }
  }
  DecodeAttention attention(*ops_, positions, caches, config_);
  return ForwardRows(tokens, positions, static_cast<int>(caches.size()), attention, logits, routes);
}

}  // namespace tandem::engine
