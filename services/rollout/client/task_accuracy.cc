#include "services/rollout/client/task_accuracy.h"

#include <vector>

#include "absl/strings/str_format.h"
#include "engine/tokenizer.h"
#include "services/rollout/client/sample_fan_out.h"

namespace tandem::rollout {

absl::StatusOr<Accuracy> MeasureAccuracy(rollout::v1::RolloutService::StubInterface& rollout,
                                         const engine::Task& task, const AccuracyOptions& options) {
  const std::vector<engine::Sample> problems =
      engine::GeneratePrompts(task, options.prompts, options.prompt_seed);
  const auto request_for = [&](int first, int end) {
    rollout::v1::GenerateRequest request;
    for (int p = first; p < end; ++p) request.add_prompts()->set_text(problems[p].prompt);
    request.mutable_sampling()->set_temperature(options.temperature);
    request.mutable_sampling()->set_seed(1);
    request.mutable_sampling()->set_max_new_tokens(options.max_new_tokens);
    if (!options.adapter.empty()) {
      request.mutable_adapter()->set_adapter_name(options.adapter);
      request.mutable_adapter()->set_exact_version(options.version);
    }
    return request;
  };
  const ReplicaStub replica{.address = "rollout", .stub = &rollout};
  SampleFanOut fan_out;
  absl::StatusOr<std::vector<rollout::v1::GenerateResponse>> responses = fan_out.Generate(
      {&replica, 1},
      {.num_prompts = static_cast<int>(problems.size()),
       .request_id_prefix = absl::StrFormat("accuracy-%s-%d-%x", options.adapter, options.version,
                                            absl::ToUnixNanos(absl::Now())),
       .timeout = options.timeout},
      request_for);
  if (!responses.ok()) return responses.status();
  Accuracy accuracy{.total = static_cast<int>(problems.size())};
  for (const rollout::v1::GenerateResponse& response : *responses) {
    const std::vector<int> tokens(response.token_ids().begin(), response.token_ids().end());
    accuracy.correct += task.Reward(problems[response.prompt_index()].prompt,
                                    engine::Decode(tokens, engine::SpecialTokens::kRender)) >= 1;
  }
  return accuracy;
}

}  // namespace tandem::rollout
