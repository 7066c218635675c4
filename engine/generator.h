#ifndef TANDEM_ENGINE_GENERATOR_H_
#define TANDEM_ENGINE_GENERATOR_H_

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/decode_engine.h"
#include "engine/sampler.h"
#include "engine/transformer.h"

namespace tandem::engine {

struct GenerationRequest {
  std::vector<int> prompt;  // Token ids, at least one.
  int max_new_tokens = 16;
  SamplingConfig sampling;
  // Seeds this sample's own random stream; derive it per sample with MixSeed(request seed,
  // sample index) so tokens do not depend on batching.
  uint64_t seed = 0;
  // Generation ends after sampling any of these (it is kept).
  std::vector<int> stop_tokens;
};

// kError: the engine failed (e.g. a GPU fault); GeneratedSample::error says how.
enum class FinishReason { kStop, kLength, kCancelled, kError };

struct GeneratedSample {
  std::vector<int> tokens;  // Prompt followed by the generated tokens.
  int prompt_length = 0;
  std::vector<float> logprobs;  // Per generated token, under the untempered policy.
  FinishReason finish_reason = FinishReason::kLength;
  std::string error;  // With kError: the engine's status.
  // One row per forwarded position (every token but the last): [tokens - 1, moe_layers, top_k].
  std::vector<int16_t> routes;
};

// Continuous batching: sequences join (prefill) and leave (finish) between decode steps, each
// decode step forwarding one token of every active sequence. Each sequence runs on its own
// engine (e.g. one per resident adapter version; all over one base model, all of one kind:
// Transformers over the CPU backend, or over the CUDA backend on one GPU), and may move to
// another between steps; a step forwards the sequences of each engine together.
class GenerationBatch {
 public:
  // `engine` is the default for sequences admitted without one.
  explicit GenerationBatch(DecodeEngine& engine);
  ~GenerationBatch();

  // Reserves the sequence's KV cache (prompt + max_new_tokens, capped at max_seq_len), prefills
  // the prompt on `engine` (null: the default) and samples its first token; returns the
  // sequence's id. INVALID_ARGUMENT for an empty prompt, bad token ids, a prompt that leaves no
  // room before max_seq_len, max_new_tokens < 1, or bad sampling values; the engine's error if
  // the cache or the prefill fails (e.g. RESOURCE_EXHAUSTED on a full GPU).
  absl::StatusOr<int> Admit(const GenerationRequest& request, DecodeEngine* engine = nullptr);

  // A sequence to admit and the engine it runs on (null: the default).
  struct Admission {
    GenerationRequest request;
    DecodeEngine* engine = nullptr;
  };
  // Admits several sequences as Admit does each, but prefills the prompts of each engine
  // together (one pass on a GPU rather than one per prompt). Returns each one's id or why it was
  // refused, in order. A prefill the device has no memory for is retried in halves; when an
  // engine's prefill fails otherwise, every sequence of that engine is refused with its error
  // and the others go on.
  std::vector<absl::StatusOr<int>> AdmitAll(const std::vector<Admission>& admissions);

  // Runs the sequence's later steps on `engine` (its KV cache is kept). Returns how many
  // tokens it had generated before the switch; -1 for an unknown (finished) id.
  int SwitchEngine(int id, DecodeEngine& engine);

  // Forwards the last token of every active sequence and samples the next. If an engine's
  // forward fails, its sequences end now with what they generated (FinishReason::kError, the
  // status in GeneratedSample::error, returned by TakeFinished) and the first such error is
  // returned.
  absl::Status Step();

  // Sequences that finished since the last call, with their ids.
  std::vector<std::pair<int, GeneratedSample>> TakeFinished();

  // Drops a sequence (e.g. its client went away) and frees its KV cache.
  void Cancel(int id);

  // Ends a sequence now, keeping what it generated (FinishReason::kCancelled, e.g. the server is
  // draining); it is returned by the next TakeFinished. False for an unknown id.
  bool Stop(int id);

  int active() const { return static_cast<int>(active_.size()); }
  // KV-cache bytes reserved by the active sequences, for admission control.
  int64_t kv_cache_bytes() const;
  // Bytes one cached token costs: keys and values of every layer.
  int64_t kv_bytes_per_token() const;
  // Positions a request reserves: prompt + max_new_tokens, capped at max_seq_len.
  int ReservedPositions(const GenerationRequest& request) const;

 private:
  struct Sequence;

  // The sequence of an admission, its cache reserved; or why it cannot be admitted.
  absl::StatusOr<std::unique_ptr<Sequence>> Reserve(const Admission& admission);
  // Prefills the prompts of sequences that share an engine; samples each one's first token.
  absl::Status PrefillGroup(DecodeEngine& engine, std::span<Sequence* const> group);
  // PrefillGroup, retried in halves while the device runs out of memory for the whole group
  // (RESOURCE_EXHAUSTED), so only a prompt that fails alone is refused. Each one's status.
  std::vector<absl::Status> PrefillInParts(DecodeEngine& engine, std::span<Sequence* const> group);
  void SampleNext(Sequence& sequence, const float* logits);
  bool Finished(const Sequence& sequence) const;
  void Retire(int id);
  // One decode forward of the sequences that share an engine.
  absl::Status StepGroup(DecodeEngine& engine, const std::vector<Sequence*>& group);

  DecodeEngine& engine_;
  const ModelConfig config_;
  int next_id_ = 0;
  std::vector<std::unique_ptr<Sequence>> active_;
  std::vector<std::pair<int, GeneratedSample>> finished_;
};

// Generates all requests to completion in one batch (a convenience over GenerationBatch).
absl::StatusOr<std::vector<GeneratedSample>> Generate(
    DecodeEngine& engine, const std::vector<GenerationRequest>& requests);

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_GENERATOR_H_
