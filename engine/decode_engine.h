#ifndef TANDEM_ENGINE_DECODE_ENGINE_H_
#define TANDEM_ENGINE_DECODE_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/config.h"
#include "engine/model.h"

namespace tandem::engine {

// One sequence's cached keys and values, in the memory its engine computes in (host for the
// Transformer over the CPU backend, a GPU's over the CUDA one).
class SequenceCache {
 public:
  virtual ~SequenceCache() = default;
};

// One sequence's prompt for Prefill: `length` tokens at positions 0..length-1, whose keys and
// values fill `cache`.
struct PromptToPrefill {
  const int* tokens = nullptr;
  int length = 0;
  SequenceCache* cache = nullptr;
};

// What generation needs of a model: forwards over sequences whose keys and values it caches.
// A cache made by one engine serves every engine of the same kind over the same base model
// (CPU with CPU, one GPU with that GPU), which lets a sequence move between adapter versions.
class DecodeEngine {
 public:
  virtual ~DecodeEngine() = default;

  virtual const ModelConfig& config() const = 0;

  // A cache with room for `positions` tokens (<= max_seq_len) of one sequence.
  virtual absl::StatusOr<std::unique_ptr<SequenceCache>> NewCache(int positions) = 0;

  // Forwards the prompts of several sequences, each attending within itself, filling their
  // caches. Writes each prompt's logits at its last position, [prompts, vocab] (all generation
  // samples from), and the routes of every prompt row, [Σ lengths, moe_layers, top_k], prompts
  // in order (host memory). An engine may forward them in one pass (a GPU's does: one pass for
  // many prompts rather than a pass each is what keeps it busy) or one by one.
  virtual absl::Status Prefill(const std::vector<PromptToPrefill>& prompts, float* last_logits,
                               int16_t* routes) = 0;

  // Forwards one token of each sequence: row i is token tokens[i] at position positions[i] of
  // the sequence whose cache is caches[i] (holding positions 0..positions[i]-1; this adds
  // positions[i]). Writes logits [rows, vocab] and routes [rows, moe_layers, top_k].
  virtual absl::Status Decode(const int* tokens, const int* positions,
                              const std::vector<SequenceCache*>& caches, float* logits,
                              int16_t* routes) = 0;
};

// Makes the decode engine of one served model: the base model alone (lora null) or one adapter
// version over it (engine::MakeDecodeEngineMaker picks CPU or GPU). Thread-safe; the models must
// outlive the engines.
using DecodeEngineMaker =
    std::function<absl::StatusOr<std::unique_ptr<DecodeEngine>>(BaseModel&, LoraAdapter*)>;

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_DECODE_ENGINE_H_
