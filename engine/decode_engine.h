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

// One sequence's cached keys and values, in the memory its engine computes in (host for the CPU
// Transformer, a GPU's for CudaTransformer).
class SequenceCache {
 public:
  virtual ~SequenceCache() = default;
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

  // Forwards the `rows` prompt tokens of one sequence at positions 0..rows-1, filling `cache`;
  // writes logits [rows, vocab] and the routes used [rows, moe_layers, top_k] (host memory).
  virtual absl::Status Prefill(const int* tokens, int rows, SequenceCache& cache, float* logits,
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
