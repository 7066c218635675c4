#include "services/trainer/job/task_source.h"

#include <fstream>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
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

// The fields of a dataset row, with their defaults.
struct DatasetFields {
  std::string prompt;
  std::string messages;
  std::string answer;
};

absl::StatusOr<std::vector<engine::text::ChatMessage>> ParseMessages(const nlohmann::json& list) {
  if (!list.is_array() || list.empty())
    return InvalidRequest("BAD_DATASET", "is not a non-empty list");
  std::vector<engine::text::ChatMessage> messages;
  for (size_t i = 0; i < list.size(); ++i) {
    const nlohmann::json& message = list[i];
    if (!message.is_object() || !message.contains("role") || !message["role"].is_string() ||
        !message.contains("content") || !message["content"].is_string()) {
      return InvalidRequest(
          "BAD_DATASET", absl::StrCat("message ", i, " needs string fields 'role' and 'content'"));
    }
    messages.push_back({message["role"].get<std::string>(), message["content"].get<std::string>()});
  }
  return messages;
}

// One row's prompt text: its prompt field as is, or its conversation rendered by the codec.
absl::StatusOr<std::string> RowPrompt(const nlohmann::json& row, const DatasetFields& fields,
                                      const engine::text::TextCodec& codec) {
  if (row.contains(fields.prompt) && row[fields.prompt].is_string()) {
    return row[fields.prompt].get<std::string>();
  }
  if (!row.contains(fields.messages)) {
    return InvalidRequest(
        "BAD_DATASET", absl::StrCat("need a string field '", fields.prompt, "' or a conversation '",
                                    fields.messages, "'"));
  }
  auto messages = ParseMessages(row[fields.messages]);
  if (!messages.ok()) {
    return Annotate(messages.status(), absl::StrCat("'", fields.messages, "' "));
  }
  return codec.RenderChat(*messages);
}

absl::StatusOr<std::unique_ptr<engine::Task>> LoadDataset(const trainer::v1::DatasetSpec& spec,
                                                          const engine::text::TextCodec& codec) {
  auto verifier = engine::FindVerifier(spec.verifier());
  if (!verifier.ok()) return verifier.status();
  std::ifstream in(spec.path());
  if (!in) return absl::NotFoundError(absl::StrCat("dataset '", spec.path(), "' cannot be read"));
  const DatasetFields fields{.prompt = spec.prompt_field(),
                             .messages = spec.messages_field(),
                             .answer = spec.answer_field()};
  std::vector<engine::Sample> samples;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const std::string where = absl::StrCat("dataset '", spec.path(), "' line ", number, ": ");
    if (!row.is_object() || !row.contains(fields.answer) || !row[fields.answer].is_string()) {
      return InvalidRequest(
          "BAD_DATASET",
          absl::StrCat(where, "need a JSON object with a string field '", fields.answer, "'"));
    }
    auto prompt = RowPrompt(row, fields, codec);
    if (!prompt.ok()) return Annotate(prompt.status(), where);
    samples.push_back({*std::move(prompt), row[fields.answer].get<std::string>()});
  }
  if (samples.empty()) {
    return InvalidRequest("BAD_DATASET", absl::StrCat("dataset '", spec.path(), "' has no rows"));
  }
  return std::make_unique<DatasetTask>(std::move(samples), *verifier);
}

}  // namespace

absl::StatusOr<std::unique_ptr<engine::Task>> MakeJobTask(const trainer::v1::JobSpec& spec,
                                                          const engine::text::TextCodec& codec) {
  if (spec.has_dataset()) return LoadDataset(spec.dataset(), codec);
  int digits = 0;
  if (auto found = spec.task().params().find("digits");
      found == spec.task().params().end() || !absl::SimpleAtoi(found->second, &digits)) {
    return InvalidField(KeyPath("spec.task.params", "digits"),
                        "task.params.digits: missing or not a number");
  }
  auto task = engine::MakeTask(spec.task().name(), digits);
  if (!task.ok()) {
    // An unknown name is NOT_FOUND to the engine; here, as at CreateJob, a bad spec field.
    return InvalidField(absl::IsNotFound(task.status()) ? std::string("spec.task.name")
                                                        : KeyPath("spec.task.params", "digits"),
                        task.status().message());
  }
  return task;
}

}  // namespace tandem::trainer
