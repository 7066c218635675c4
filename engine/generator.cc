#include "engine/generator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/attention.h"

namespace tandem::engine {

struct GenerationBatch::Sequence {
  int id = 0;
  GenerationRequest request;
  GeneratedSample sample;
  Transformer* transformer = nullptr;
  std::mt19937_64 rng;
  // Per layer [reserved, key_width] keys and [reserved, value_width] values; rows [0, cached)
  // are filled.
  std::vector<std::vector<float>> keys, values;
  int reserved = 0;
  int cached = 0;
};

// Prompt rows of one sequence: causal attention among them, caching their keys and values.
class GenerationBatch::PrefillAttention : public AttentionBackend {
 public:
  PrefillAttention(Sequence& sequence, const ModelConfig& config)
      : sequence_(sequence), config_(config) {}

  void Attend(int layer, const float* q, const float* k, const float* v, float* out) override {
    const int rows = static_cast<int>(sequence_.sample.tokens.size());
    std::copy_n(k, int64_t{rows} * config_.key_width(), sequence_.keys[layer].begin());
    std::copy_n(v, int64_t{rows} * config_.value_width(), sequence_.values[layer].begin());
    probs_.resize(static_cast<size_t>(config_.num_heads) * rows * rows);
    cpu::CausalAttention(q, k, v, out, probs_.data(), rows, config_.attention_shape());
  }

 private:
  Sequence& sequence_;
  const ModelConfig& config_;
  std::vector<float> probs_;
};

// One row per active sequence: append its key/value to the cache, attend over the cache.
class GenerationBatch::DecodeAttention : public AttentionBackend {
 public:
  DecodeAttention(const std::vector<Sequence*>& sequences, const ModelConfig& config)
      : sequences_(sequences), config_(config), scratch_(config.max_seq_len) {}

  void Attend(int layer, const float* q, const float* k, const float* v, float* out) override {
    const cpu::AttentionShape shape = config_.attention_shape();
    const int q_width = config_.query_width(), out_width = config_.attention_out_dim();
    const int k_width = config_.key_width(), v_width = config_.value_width();
    for (size_t row = 0; row < sequences_.size(); ++row) {
      Sequence& sequence = *sequences_[row];
      const int position = sequence.cached;
      std::copy_n(k + row * k_width, k_width,
                  sequence.keys[layer].begin() + int64_t{position} * k_width);
      std::copy_n(v + row * v_width, v_width,
                  sequence.values[layer].begin() + int64_t{position} * v_width);
      cpu::DecodeAttention(q + row * q_width, sequence.keys[layer].data(),
                           sequence.values[layer].data(), position + 1, out + row * out_width,
                           shape, scratch_.data());
    }
  }

 private:
  const std::vector<Sequence*>& sequences_;
  const ModelConfig& config_;
  std::vector<float> scratch_;
};

GenerationBatch::GenerationBatch(Transformer& transformer)
    : transformer_(transformer), config_(transformer.config()) {}

GenerationBatch::~GenerationBatch() = default;

int64_t GenerationBatch::kv_bytes_per_token() const {
  return int64_t{config_.num_layers} * (config_.key_width() + config_.value_width()) *
         static_cast<int64_t>(sizeof(float));
}

int64_t GenerationBatch::kv_cache_bytes() const {
  int64_t positions = 0;
  for (const auto& sequence : active_) positions += sequence->reserved;
  return positions * kv_bytes_per_token();
}

int GenerationBatch::ReservedPositions(const GenerationRequest& request) const {
  const int64_t wanted = static_cast<int64_t>(request.prompt.size()) + request.max_new_tokens;
  return static_cast<int>(std::min<int64_t>(wanted, config_.max_seq_len));
}

absl::StatusOr<int> GenerationBatch::Admit(const GenerationRequest& request,
                                           Transformer* transformer) {
  const int prompt_length = static_cast<int>(request.prompt.size());
  if (prompt_length < 1 || prompt_length >= config_.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt has ", prompt_length, " tokens; allowed 1..", config_.max_seq_len - 1));
  }
  for (int t = 0; t < prompt_length; ++t) {
    if (request.prompt[t] < 0 || request.prompt[t] >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", t, " is ", request.prompt[t],
                                                     ", outside [0, ", config_.vocab_size, ")"));
    }
  }
  if (request.max_new_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_new_tokens = ", request.max_new_tokens, " must be >= 1"));
  }
  if (absl::Status status = Validate(request.sampling); !status.ok()) return status;

  auto sequence = std::make_unique<Sequence>();
  sequence->id = next_id_++;
  sequence->request = request;
  sequence->sample.tokens = request.prompt;
  sequence->sample.prompt_length = prompt_length;
  sequence->transformer = transformer != nullptr ? transformer : &transformer_;
  sequence->rng.seed(request.seed);
  sequence->reserved = ReservedPositions(request);
  sequence->keys.assign(
      config_.num_layers,
      std::vector<float>(static_cast<size_t>(sequence->reserved) * config_.key_width()));
  sequence->values.assign(
      config_.num_layers,
      std::vector<float>(static_cast<size_t>(sequence->reserved) * config_.value_width()));

  const int moe_row = config_.num_moe_layers() * config_.top_k;
  std::vector<int> positions(prompt_length);
  for (int t = 0; t < prompt_length; ++t) positions[t] = t;
  std::vector<float> logits(static_cast<size_t>(prompt_length) * config_.vocab_size);
  sequence->sample.routes.resize(static_cast<size_t>(prompt_length) * moe_row);
  PrefillAttention attention(*sequence, config_);
  sequence->transformer->ForwardRows(request.prompt.data(), positions.data(), prompt_length,
                                     attention, logits.data(), sequence->sample.routes.data());
  sequence->cached = prompt_length;
  SampleNext(*sequence, logits.data() + int64_t{prompt_length - 1} * config_.vocab_size);
  const int id = sequence->id;
  active_.push_back(std::move(sequence));
  if (Finished(*active_.back())) Retire(id);
  return id;
}

void GenerationBatch::SampleNext(Sequence& sequence, const float* logits) {
  const SampledToken token =
      SampleToken(logits, config_.vocab_size, sequence.request.sampling, sequence.rng);
  sequence.sample.tokens.push_back(token.token);
  sequence.sample.logprobs.push_back(token.logprob);
  const std::vector<int>& stops = sequence.request.stop_tokens;
  if (std::find(stops.begin(), stops.end(), token.token) != stops.end()) {
    sequence.sample.finish_reason = FinishReason::kStop;
  }
}

bool GenerationBatch::Finished(const Sequence& sequence) const {
  const int generated = static_cast<int>(sequence.sample.logprobs.size());
  return sequence.sample.finish_reason == FinishReason::kStop ||
         generated >= sequence.request.max_new_tokens ||
         static_cast<int>(sequence.sample.tokens.size()) >= sequence.reserved;
}

int GenerationBatch::SwitchTransformer(int id, Transformer& transformer) {
  for (const auto& sequence : active_) {
    if (sequence->id != id) continue;
    sequence->transformer = &transformer;
    return static_cast<int>(sequence->sample.logprobs.size());
  }
  return -1;
}

void GenerationBatch::Step() {
  // Groups in order of first appearance, so a step's work does not depend on pointer values.
  std::vector<std::pair<Transformer*, std::vector<Sequence*>>> groups;
  for (const auto& sequence : active_) {
    auto group = std::find_if(groups.begin(), groups.end(),
                              [&](const auto& g) { return g.first == sequence->transformer; });
    if (group == groups.end()) group = groups.insert(groups.end(), {sequence->transformer, {}});
    group->second.push_back(sequence.get());
  }
  std::vector<int> done;
  for (auto& [transformer, group] : groups) {
    StepGroup(*transformer, group);
    for (Sequence* sequence : group) {
      if (Finished(*sequence)) done.push_back(sequence->id);
    }
  }
  for (int id : done) Retire(id);
}

void GenerationBatch::StepGroup(Transformer& transformer, const std::vector<Sequence*>& group) {
  const int rows = static_cast<int>(group.size());
  std::vector<int> tokens(rows), positions(rows);
  for (int row = 0; row < rows; ++row) {
    tokens[row] = group[row]->sample.tokens.back();
    positions[row] = group[row]->cached;
  }
  const int moe_row = config_.num_moe_layers() * config_.top_k;
  std::vector<float> logits(static_cast<size_t>(rows) * config_.vocab_size);
  std::vector<int16_t> routes(static_cast<size_t>(rows) * moe_row);
  DecodeAttention attention(group, config_);
  transformer.ForwardRows(tokens.data(), positions.data(), rows, attention, logits.data(),
                          routes.data());
  for (int row = 0; row < rows; ++row) {
    Sequence& sequence = *group[row];
    ++sequence.cached;
    sequence.sample.routes.insert(sequence.sample.routes.end(), routes.begin() + row * moe_row,
                                  routes.begin() + (row + 1) * moe_row);
    SampleNext(sequence, logits.data() + int64_t{row} * config_.vocab_size);
  }
}

void GenerationBatch::Retire(int id) {
  auto found = std::find_if(active_.begin(), active_.end(),
                            [id](const auto& sequence) { return sequence->id == id; });
  finished_.emplace_back(id, std::move((*found)->sample));
  active_.erase(found);
}

bool GenerationBatch::Stop(int id) {
  auto found = std::find_if(active_.begin(), active_.end(),
                            [id](const auto& sequence) { return sequence->id == id; });
  if (found == active_.end()) return false;
  (*found)->sample.finish_reason = FinishReason::kCancelled;
  Retire(id);
  return true;
}

void GenerationBatch::Cancel(int id) {
  std::erase_if(active_, [id](const auto& sequence) { return sequence->id == id; });
}

std::vector<std::pair<int, GeneratedSample>> GenerationBatch::TakeFinished() {
  return std::exchange(finished_, {});
}

absl::StatusOr<std::vector<GeneratedSample>> Generate(
    Transformer& transformer, const std::vector<GenerationRequest>& requests) {
  GenerationBatch batch(transformer);
  std::vector<int> ids;
  for (const GenerationRequest& request : requests) {
    auto id = batch.Admit(request);
    if (!id.ok()) return id.status();
    ids.push_back(*id);
  }
  while (batch.active() > 0) batch.Step();
  std::vector<GeneratedSample> samples(requests.size());
  for (auto& [id, sample] : batch.TakeFinished()) {
    const auto position = std::find(ids.begin(), ids.end(), id) - ids.begin();
    samples[position] = std::move(sample);
  }
  return samples;
}

}  // namespace tandem::engine
