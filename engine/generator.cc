#include "engine/generator.h"

#include <algorithm>
#include <span>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem::engine {
namespace {

// `items` grouped by the engine each runs on (`engine_of`), engines in order of first
// appearance, so the work done per engine does not depend on pointer values.
template <typename Item, typename EngineOf>
std::vector<std::pair<DecodeEngine*, std::vector<Item>>> GroupByEngine(
    const std::vector<Item>& items, EngineOf engine_of) {
  std::vector<std::pair<DecodeEngine*, std::vector<Item>>> groups;
  for (const Item& item : items) {
    DecodeEngine* engine = engine_of(item);
    auto group = std::find_if(groups.begin(), groups.end(),
                              [&](const auto& g) { return g.first == engine; });
    if (group == groups.end()) group = groups.insert(groups.end(), {engine, {}});
    group->second.push_back(item);
  }
  return groups;
}

}  // namespace

struct GenerationBatch::Sequence {
  int id = 0;
  GenerationRequest request;
  GeneratedSample sample;
  DecodeEngine* engine = nullptr;
  std::mt19937_64 rng;
  std::unique_ptr<SequenceCache> cache;  // Positions [0, cached) are filled.
  int reserved = 0;
  int cached = 0;
};

GenerationBatch::GenerationBatch(DecodeEngine& engine)
    : engine_(engine), config_(engine.config()) {}

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

absl::StatusOr<int> GenerationBatch::Admit(const GenerationRequest& request, DecodeEngine* engine) {
  return AdmitAll({{.request = request, .engine = engine}}).front();
}

std::vector<absl::StatusOr<int>> GenerationBatch::AdmitAll(
    const std::vector<Admission>& admissions) {
  std::vector<absl::StatusOr<int>> ids(admissions.size());
  std::vector<std::unique_ptr<Sequence>> reserved(admissions.size());
  std::vector<size_t> admitted;  // Indices of the admissions whose cache is reserved.
  for (size_t i = 0; i < admissions.size(); ++i) {
    absl::StatusOr<std::unique_ptr<Sequence>> sequence = Reserve(admissions[i]);
    if (!sequence.ok()) {
      ids[i] = sequence.status();
      continue;
    }
    reserved[i] = *std::move(sequence);
    admitted.push_back(i);
  }
  for (auto& [engine, indices] :
       GroupByEngine(admitted, [&](size_t i) { return reserved[i]->engine; })) {
    std::vector<Sequence*> group;
    for (size_t i : indices) group.push_back(reserved[i].get());
    const std::vector<absl::Status> statuses = PrefillInParts(*engine, group);
    for (size_t k = 0; k < indices.size(); ++k) {
      const size_t i = indices[k];
      if (!statuses[k].ok()) {
        ids[i] = statuses[k];
        continue;
      }
      ids[i] = reserved[i]->id;
      active_.push_back(std::move(reserved[i]));
      if (Finished(*active_.back())) Retire(*ids[i]);
    }
  }
  return ids;
}

absl::StatusOr<std::unique_ptr<GenerationBatch::Sequence>> GenerationBatch::Reserve(
    const Admission& admission) {
  const GenerationRequest& request = admission.request;
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
  sequence->engine = admission.engine != nullptr ? admission.engine : &engine_;
  sequence->rng.seed(request.seed);
  sequence->reserved = ReservedPositions(request);
  absl::StatusOr<std::unique_ptr<SequenceCache>> cache =
      sequence->engine->NewCache(sequence->reserved);
  if (!cache.ok()) return cache.status();
  sequence->cache = *std::move(cache);
  return sequence;
}

std::vector<absl::Status> GenerationBatch::PrefillInParts(DecodeEngine& engine,
                                                         std::span<Sequence* const> group) {
  const absl::Status status = PrefillGroup(engine, group);
  if (status.ok() || group.size() == 1 || !absl::IsResourceExhausted(status)) {
    return std::vector<absl::Status>(group.size(), status);
  }
  const size_t half = group.size() / 2;
  std::vector<absl::Status> statuses = PrefillInParts(engine, group.first(half));
  const std::vector<absl::Status> rest = PrefillInParts(engine, group.subspan(half));
  statuses.insert(statuses.end(), rest.begin(), rest.end());
  return statuses;
}

absl::Status GenerationBatch::PrefillGroup(DecodeEngine& engine,
                                           std::span<Sequence* const> group) {
  const int moe_row = config_.num_moe_layers() * config_.top_k;
  std::vector<PromptToPrefill> prompts;
  int64_t rows = 0;
  for (Sequence* sequence : group) {
    const int length = sequence->sample.prompt_length;
    prompts.push_back({.tokens = sequence->request.prompt.data(),
                       .length = length,
                       .cache = sequence->cache.get()});
    rows += length;
  }
  std::vector<float> last_logits(group.size() * config_.vocab_size);
  std::vector<int16_t> routes(rows * moe_row);
  if (absl::Status status = engine.Prefill(prompts, last_logits.data(), routes.data());
      !status.ok()) {
    return status;
  }
  const int16_t* sequence_routes = routes.data();
  for (size_t s = 0; s < group.size(); ++s) {
    Sequence& sequence = *group[s];
    const int64_t route_count = int64_t{sequence.sample.prompt_length} * moe_row;
    sequence.sample.routes.assign(sequence_routes, sequence_routes + route_count);
    sequence_routes += route_count;
    sequence.cached = sequence.sample.prompt_length;
    SampleNext(sequence, last_logits.data() + s * config_.vocab_size);
  }
  return absl::OkStatus();
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

int GenerationBatch::SwitchEngine(int id, DecodeEngine& engine) {
  for (const auto& sequence : active_) {
    if (sequence->id != id) continue;
    sequence->engine = &engine;
    return static_cast<int>(sequence->sample.logprobs.size());
  }
  return -1;
}

absl::Status GenerationBatch::Step() {
  std::vector<Sequence*> sequences;
  for (const auto& sequence : active_) sequences.push_back(sequence.get());
  absl::Status first_error;
  std::vector<int> done;
  for (auto& [engine, group] :
       GroupByEngine(sequences, [](Sequence* sequence) { return sequence->engine; })) {
    const absl::Status status = StepGroup(*engine, group);
    if (!status.ok() && first_error.ok()) first_error = status;
    for (Sequence* sequence : group) {
      if (!status.ok()) {
        sequence->sample.finish_reason = FinishReason::kError;
        sequence->sample.error = status.ToString();
      }
      if (!status.ok() || Finished(*sequence)) done.push_back(sequence->id);
    }
  }
  for (int id : done) Retire(id);
  return first_error;
}

absl::Status GenerationBatch::StepGroup(DecodeEngine& engine, const std::vector<Sequence*>& group) {
  const int rows = static_cast<int>(group.size());
  std::vector<int> tokens(rows), positions(rows);
  std::vector<SequenceCache*> caches(rows);
  for (int row = 0; row < rows; ++row) {
    tokens[row] = group[row]->sample.tokens.back();
    positions[row] = group[row]->cached;
    caches[row] = group[row]->cache.get();
  }
  const int moe_row = config_.num_moe_layers() * config_.top_k;
  std::vector<float> logits(static_cast<size_t>(rows) * config_.vocab_size);
  std::vector<int16_t> routes(static_cast<size_t>(rows) * moe_row);
  if (absl::Status status =
          engine.Decode(tokens.data(), positions.data(), caches, logits.data(), routes.data());
      !status.ok()) {
    return status;
  }
  for (int row = 0; row < rows; ++row) {
    Sequence& sequence = *group[row];
    ++sequence.cached;
    sequence.sample.routes.insert(sequence.sample.routes.end(), routes.begin() + row * moe_row,
                                  routes.begin() + (row + 1) * moe_row);
    SampleNext(sequence, logits.data() + int64_t{row} * config_.vocab_size);
  }
  return absl::OkStatus();
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
    DecodeEngine& engine, const std::vector<GenerationRequest>& requests) {
  GenerationBatch batch(engine);
  std::vector<GenerationBatch::Admission> admissions;
  for (const GenerationRequest& request : requests) admissions.push_back({.request = request});
  std::vector<int> ids;
  for (absl::StatusOr<int>& id : batch.AdmitAll(admissions)) {
    if (!id.ok()) return id.status();
    ids.push_back(*id);
  }
  while (batch.active() > 0) {
    if (absl::Status status = batch.Step(); !status.ok()) return status;
  }
  std::vector<GeneratedSample> samples(requests.size());
  for (auto& [id, sample] : batch.TakeFinished()) {
    const auto position = std::find(ids.begin(), ids.end(), id) - ids.begin();
    samples[position] = std::move(sample);
  }
  return samples;
}

}  // namespace tandem::engine
