#include "engine/tasks.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "engine/tokenizer.h"

namespace tandem::engine {
namespace {

// Uniform in [0, n) by rejection on the raw engine output: exact and identical across standard
// libraries, unlike std::uniform_int_distribution, so a seed names the same prompts everywhere.
uint64_t UniformBelow(std::mt19937_64& rng, uint64_t n) {
  const uint64_t limit =
      std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % n;
  uint64_t draw = rng();
  while (draw >= limit) draw = rng();
  return draw % n;
}

int DrawLength(std::mt19937_64& rng, int max_digits) {
  return 1 + static_cast<int>(UniformBelow(rng, static_cast<uint64_t>(max_digits)));
}

bool IsDigits(absl::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), absl::ascii_isdigit);
}

// The part of `prompt` between `prefix` and the closing '=', or nullopt if it has other framing.
std::optional<absl::string_view> Body(absl::string_view prompt, absl::string_view prefix) {
  if (!absl::ConsumePrefix(&prompt, prefix) || !absl::ConsumeSuffix(&prompt, "=")) {
    return std::nullopt;
  }
  return prompt;
}

class AdditionTask final : public Task {
 public:
  explicit AdditionTask(int digits) : digits_(digits) {}

  absl::string_view name() const override { return "addition"; }

  Sample Generate(std::mt19937_64& rng) const override {
    const int64_t a = DrawNumber(rng);
    const int64_t b = DrawNumber(rng);
    return {absl::StrCat(a, "+", b, "="), absl::StrCat(a + b)};
  }

  std::optional<std::string> Answer(absl::string_view prompt_text) const override {
    const std::optional<absl::string_view> body = Body(prompt_text, "");
    if (!body) return std::nullopt;
    const size_t plus = body->find('+');
    if (plus == absl::string_view::npos) return std::nullopt;
    const std::optional<int64_t> a = ParseOperand(body->substr(0, plus));
    const std::optional<int64_t> b = ParseOperand(body->substr(plus + 1));
    if (!a || !b) return std::nullopt;
    return absl::StrCat(*a + *b);
  }

 private:
  // A number of exactly the drawn length: no leading zero except for the one-digit 0.
  int64_t DrawNumber(std::mt19937_64& rng) const {
    const int length = DrawLength(rng, digits_);
    int64_t low = 1;
    for (int i = 1; i < length; ++i) low *= 10;
    const int64_t first = length == 1 ? 0 : low;
    return first + static_cast<int64_t>(UniformBelow(rng, static_cast<uint64_t>(10 * low - first)));
  }

  // The length bound keeps the sum far from int64 overflow whatever the prompt says.
  static std::optional<int64_t> ParseOperand(absl::string_view text) {
    int64_t value = 0;
    if (!IsDigits(text) || text.size() > kMaxTaskDigits || !absl::SimpleAtoi(text, &value)) {
      return std::nullopt;
    }
    return value;
  }

  int digits_;
};

// Tasks of the form "<prefix><digits>=" whose answer rearranges the digits.
class DigitStringTask final : public Task {
 public:
  using Transform = std::string (*)(absl::string_view digits);

  DigitStringTask(absl::string_view name, absl::string_view prefix, Transform transform, int digits)
      : name_(name), prefix_(prefix), transform_(transform), digits_(digits) {}

  absl::string_view name() const override { return name_; }

  Sample Generate(std::mt19937_64& rng) const override {
    std::string digits(static_cast<size_t>(DrawLength(rng, digits_)), '0');
    for (char& digit : digits) digit = static_cast<char>('0' + UniformBelow(rng, 10));
    return {absl::StrCat(prefix_, digits, "="), transform_(digits)};
  }

  std::optional<std::string> Answer(absl::string_view prompt_text) const override {
    const std::optional<absl::string_view> body = Body(prompt_text, prefix_);
    if (!body || !IsDigits(*body)) return std::nullopt;
    return transform_(*body);
  }

 private:
  std::string name_;
  std::string prefix_;
  Transform transform_;
  int digits_;
};

std::string Reversed(absl::string_view digits) {
  return std::string(digits.rbegin(), digits.rend());
}

std::string Sorted(absl::string_view digits) {
  std::string sorted(digits);
  std::sort(sorted.begin(), sorted.end());
  return sorted;
}

}  // namespace

double Task::Reward(const std::string& prompt_text, const std::string& completion_text) const {
  const std::optional<std::string> answer = Answer(prompt_text);
  if (!answer) return 0.0;
  return CompletionBeforeEos(completion_text) == *answer ? 1.0 : 0.0;
}

absl::string_view Task::CompletionBeforeEos(const std::string& completion_text) {
  absl::string_view completion = completion_text;
  return completion.substr(0, completion.find(kSpecialTokenText[kEosId]));
}

absl::StatusOr<std::unique_ptr<Task>> MakeTask(absl::string_view name, int digits) {
  if (name != "addition" && name != "reverse" && name != "sort") {
    return absl::NotFoundError(
        absl::StrCat("unknown task \"", name, "\"; known tasks: addition, reverse, sort"));
  }
  if (digits < 1 || digits > kMaxTaskDigits) {
    return absl::InvalidArgumentError(
        absl::StrCat("task digits = ", digits, " is outside [1, ", kMaxTaskDigits, "]"));
  }
  if (name == "addition") return std::make_unique<AdditionTask>(digits);
  if (name == "reverse") {
    return std::make_unique<DigitStringTask>("reverse", "r:", Reversed, digits);
  }
  return std::make_unique<DigitStringTask>("sort", "s:", Sorted, digits);
}

std::vector<Sample> GeneratePrompts(const Task& task, int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Sample> samples;
  samples.reserve(static_cast<size_t>(std::max(count, 0)));
  for (int i = 0; i < count; ++i) samples.push_back(task.Generate(rng));
  return samples;
}

}  // namespace tandem::engine
