#ifndef TANDEM_ENGINE_TASKS_H_
#define TANDEM_ENGINE_TASKS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::engine {

// One problem of a task: the model sees `prompt` and should write `answer` then <eos>.
struct Sample {
  std::string prompt;
  std::string answer;
};

// A synthetic task whose answers are checked exactly, so RL needs no learned reward model.
// All text stays inside the tokenizer alphabet.
class Task {
 public:
  virtual ~Task() = default;

  virtual absl::string_view name() const = 0;
  virtual Sample Generate(std::mt19937_64& rng) const = 0;
  // The correct answer to `prompt_text`, or nullopt when it is not a prompt of this task.
  virtual std::optional<std::string> Answer(absl::string_view prompt_text) const = 0;

  // 1 when the completion is exactly the answer, else 0 (also for prompts of another task).
  // The completion ends at its first "<eos>" (Decode with SpecialTokens::kRender) or at the end
  // of the text; anything else, whitespace included, is a wrong answer. Datasets override it
  // with the verifier their job names.
  virtual double Reward(const std::string& prompt_text, const std::string& completion_text) const;

 protected:
  // The completion up to its first "<eos>".
  static absl::string_view CompletionBeforeEos(const std::string& completion_text);
};

// Largest operand length: a sum of two 9-digit numbers fits comfortably in int64.
inline constexpr int kMaxTaskDigits = 9;
// Digits of a task's numbers when the job leaves them unset.
inline constexpr int kDefaultTaskDigits = 2;

// Tasks, each with operands of 1..`digits` digits (the length is drawn uniformly first, so
// short problems stay frequent instead of making up a vanishing share of uniform values):
//   "addition": "12+345=" -> "357"
//   "reverse":  "r:1234=" -> "4321"
//   "sort":     "s:3141=" -> "1134" (ascending)
// NOT_FOUND for an unknown name; INVALID_ARGUMENT for digits outside 1..kMaxTaskDigits.
absl::StatusOr<std::unique_ptr<Task>> MakeTask(absl::string_view name, int digits);

// `count` samples (none when count <= 0), the same for the same seed on every platform:
// draws use only the raw engine output, never the implementation-defined std distributions.
std::vector<Sample> GeneratePrompts(const Task& task, int count, uint64_t seed);

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_TASKS_H_
