#ifndef TANDEM_SERVICES_ROLLOUT_CLIENT_TASK_ACCURACY_H_
#define TANDEM_SERVICES_ROLLOUT_CLIENT_TASK_ACCURACY_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/tasks.h"
#include "tandem/rollout/v1/rollout.grpc.pb.h"

namespace tandem::rollout {

struct AccuracyOptions {
  std::string adapter;  // Empty: the base model.
  int64_t version = 0;  // Exact version of `adapter`.
  int prompts = 200;
  uint64_t prompt_seed = 0;  // Draws the problems (GeneratePrompts).
  int max_new_tokens = 8;
  float temperature = 0;  // 0: greedy.
  absl::Duration timeout = absl::Minutes(5);
};

struct Accuracy {
  int correct = 0;
  int total = 0;
  double share() const { return total == 0 ? 0 : static_cast<double>(correct) / total; }
};

// How many of `prompts` problems of `task` a model version answers correctly (the task's own
// verifier) when a rollout replica generates one answer each.
absl::StatusOr<Accuracy> MeasureAccuracy(rollout::v1::RolloutService::StubInterface& rollout,
                                         const engine::Task& task, const AccuracyOptions& options);

}  // namespace tandem::rollout

#endif  // TANDEM_SERVICES_ROLLOUT_CLIENT_TASK_ACCURACY_H_
