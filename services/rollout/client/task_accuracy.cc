#include "services/rollout/client/task_accuracy.h"

#include <vector>

#include "absl/strings/str_format.h"
#include "common/channel.h"
#include "common/status.h"
#include "engine/tokenizer.h"

namespace tandem::rollout {

absl::StatusOr<Accuracy> MeasureAccuracy(rollout::v1::RolloutService::StubInterface& rollout,
                                         const engine::Task& task, const AccuracyOptions& options) {
  const std::vector<engine::Sample> problems =
      engine::GeneratePrompts(task, options.prompts, options.prompt_seed);
  rollout::v1::GenerateRequest request;
  request.set_request_id(absl::StrFormat("accuracy-%s-%d-%x", options.adapter, options.version,
                                         absl::ToUnixNanos(absl::Now())));
  for (const engine::Sample& problem : problems) request.add_prompts()->set_text(problem.prompt);
  request.mutable_sampling()->set_temperature(options.temperature);
  request.mutable_sampling()->set_seed(1);
  request.mutable_sampling()->set_max_new_tokens(options.max_new_tokens);
  if (!options.adapter.empty()) {
    request.mutable_adapter()->set_adapter_name(options.adapter);
    request.mutable_adapter()->set_exact_version(options.version);
  }
  grpc::ClientContext context;
  SetTimeout(context, options.timeout);
  auto reader = rollout.Generate(&context, request);
  rollout::v1::GenerateResponse response;
  Accuracy accuracy{.total = static_cast<int>(problems.size())};
  while (reader->Read(&response)) {
    const std::vector<int> tokens(response.token_ids().begin(), response.token_ids().end());
    accuracy.correct += task.Reward(problems[response.prompt_index()].prompt,
                                    engine::Decode(tokens, engine::SpecialTokens::kRender)) >= 1;
  }
  if (absl::Status status = FromGrpcStatus(reader->Finish()); !status.ok()) return status;
  return accuracy;
}

}  // namespace tandem::rollout
