#ifndef TANDEM_ENGINE_SFT_H_
#define TANDEM_ENGINE_SFT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model.h"
#include "engine/tasks.h"
#include "engine/transformer.h"

namespace tandem::engine {

// Supervised training of a base model on a task. It stops as soon as greedy accuracy
// reaches stop_accuracy: the demo wants a base model that is partly right, so RL has
// something to improve.
struct SftConfig {
  int batch_size = 32;
  float peak_lr = 3e-3f;
  float min_lr = 3e-4f;
  int warmup_steps = 50;
  int max_steps = 4000;
  int eval_every = 100;
  int eval_prompts = 200;
  double stop_accuracy = 0.3;
  float max_grad_norm = 1.0f;
  uint64_t seed = 1;

  absl::Status Validate() const;
};

struct SftProgress {
  int step = 0;
  double loss = 0;      // Mean answer-token cross-entropy since the last report.
  double accuracy = 0;  // Greedy exact-match accuracy on held-out prompts.
};

// Trains every parameter of `model`. Calls on_eval after each evaluation; returns the last.
absl::StatusOr<SftProgress> TrainSupervised(BaseModel& model, const Task& task,
                                            const SftConfig& config,
                                            const std::function<void(const SftProgress&)>& on_eval);

// Share of `count` prompts (drawn from `seed`) that greedy decoding answers exactly.
absl::StatusOr<double> GreedyAccuracy(Transformer& transformer, const Task& task, int count,
                                      uint64_t seed);

// The text a completion's tokens spell, with <eos> rendered so Task::Reward sees the end.
std::string CompletionText(const std::vector<int>& tokens, int prompt_length);

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_SFT_H_
