#include "services/trainer/task_source.h"

#include <fstream>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/verifiers/verifier.h"
#include "nlohmann/json.hpp"

namespace tandem::trainer {
namespace {

// Prompt/answer pairs from a file, each completion scored by the job's verifier.
class DatasetTask final : public engine::Task {
 public:
  DatasetTask(std::vector<engine::Sample> samples, engine::Verifier verifier)
      : samples_(std::move(samples)), verifier_(verifier) {
    for (const engine::Sample& sample : samples_) answers_[sample.prompt] = sample.answer;
  }

  absl::string_view name() const override { return "dataset"; }

  engine::Sample Generate(std::mt19937_64& rng) const override {
    return samples_[rng() % samples_.size()];
  }

  std::optional<std::string> Answer(absl::string_view prompt_text) const override {
    auto found = answers_.find(prompt_text);
    if (found == answers_.end()) return std::nullopt;
    return found->second;
  }

  double Reward(const std::string& prompt_text, const std::string& completion_text) const override {
    const std::optional<std::string> answer = Answer(prompt_text);
    return answer ? verifier_(CompletionBeforeEos(completion_text), *answer) : 0.0;
  }

 private:
  std::vector<engine::Sample> samples_;
  engine::Verifier verifier_;
  absl::flat_hash_map<std::string, std::string> answers_;
};

absl::StatusOr<std::unique_ptr<engine::Task>> LoadDataset(const v1::DatasetSpec& spec) {
  auto verifier = engine::FindVerifier(spec.verifier());
  if (!verifier.ok()) return verifier.status();
  std::ifstream in(spec.path());
  if (!in) return absl::NotFoundError(absl::StrCat("dataset '", spec.path(), "' cannot be read"));
  const std::string prompt_field = spec.prompt_field().empty() ? "prompt" : spec.prompt_field();
  const std::string answer_field = spec.answer_field().empty() ? "answer" : spec.answer_field();
  std::vector<engine::Sample> samples;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!row.is_object() || !row.contains(prompt_field) || !row[prompt_field].is_string() ||
        !row.contains(answer_field) || !row[answer_field].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("dataset '", spec.path(), "' line ", number,
                                                     ": need string fields '", prompt_field,
                                                     "' and '", answer_field, "'"));
    }
    samples.push_back({row[prompt_field].get<std::string>(), row[answer_field].get<std::string>()});
  }
  if (samples.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("dataset '", spec.path(), "' has no rows"));
  }
  return std::make_unique<DatasetTask>(std::move(samples), *verifier);
}

}  // namespace

absl::StatusOr<std::unique_ptr<engine::Task>> MakeJobTask(const v1::JobSpec& spec) {
  if (spec.has_dataset()) return LoadDataset(spec.dataset());
  int digits = 2;
  if (auto found = spec.task().params().find("digits");
      found != spec.task().params().end() && !absl::SimpleAtoi(found->second, &digits)) {
    return absl::InvalidArgumentError(absl::StrCat("task.params.digits: '", found->second, "'"));
  }
  auto task = engine::MakeTask(spec.task().name(), digits);
  if (!task.ok()) return absl::InvalidArgumentError(task.status().message());
  return task;
}

}  // namespace tandem::trainer
