#ifndef TANDEM_SERVICES_TRAINER_STEP_SAMPLER_H_
#define TANDEM_SERVICES_TRAINER_STEP_SAMPLER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "engine/tasks.h"
#include "engine/text/text_codec.h"
#include "services/rollout/client/sample_fan_out.h"
#include "services/trainer/update/policy_update.h"
#include "tandem/rollout/v1/rollout.pb.h"
#include "tandem/trainer/v1/trainer.pb.h"

namespace tandem::trainer {

// One step's samples as this rank generated them, and how they scored (sums over them).
struct StepSamples {
  std::vector<rollout::v1::GenerateResponse> responses;  // prompt-major
  std::vector<TrainingSample> training;
  double correct = 0, reward = 0, length = 0, truncated = 0;
  double partial = 0;  // Samples that switched to a newer version mid-generation.
};

struct StepSamplerConfig {
  std::string job_id;
  const trainer::v1::JobSpec* spec = nullptr;  // Resolved (ResolveJobSpec); not owned.
  // The step's prompt groups this rank generates (a data-parallel share), and the rank.
  std::vector<int> own_groups;
  int data_parallel_rank = 0;
  bool record_routes = false;  // Ask the replicas to record routes (a router-replay is there).
  // Generation is retried while a replica is UNAVAILABLE, this many attempts in all, waiting
  // retry_backoff, then twice as long, ...
  int attempts = 6;
  absl::Duration retry_backoff = absl::Milliseconds(500);
  absl::Duration rpc_timeout = absl::Minutes(5);  // Per Generate call.
};

// The generation stage of a training step: the step's prompts from the task, sampled by the
// rollout replicas (SampleFanOut) with the adapter version being trained, scored by the task's
// verifier into training samples.
class StepSampler {
 public:
  // The sampler shares `task` and `codec` (the task may read the codec); `replicas`' stubs,
  // `fan_out` and `clock` must outlive it; `fan_out` is the run's, which cancels the calls in
  // flight when the run ends.
  StepSampler(StepSamplerConfig config, std::shared_ptr<const engine::Task> task,
              std::shared_ptr<const engine::text::TextCodec> codec,
              std::vector<rollout::ReplicaStub> replicas, rollout::SampleFanOut& fan_out,
              Clock& clock)
      : config_(std::move(config)),
        codec_(std::move(codec)),
        task_(std::move(task)),
        replicas_(std::move(replicas)),
        fan_out_(fan_out),
        clock_(clock) {}

  // This rank's samples of `step` by adapter `version`. A replica that restarts or is briefly
  // unreachable costs a retry (a new attempt number: new request ids, routes of their own), not
  // the step.
  absl::StatusOr<StepSamples> Generate(int64_t step, int64_t version);

  // The request for this rank's prompts [first, end) of a step (they keep their step-wide ids).
  rollout::v1::GenerateRequest RequestFor(int64_t step, int64_t version, int attempt, int first,
                                          int end,
                                          const std::vector<std::vector<int>>& prompt_ids) const;

 private:
  absl::StatusOr<std::vector<rollout::v1::GenerateResponse>> RequestSamples(
      int64_t step, int64_t version, int attempt, const std::vector<std::vector<int>>& prompts);
  StepSamples Score(std::vector<rollout::v1::GenerateResponse> responses,
                    const std::vector<engine::Sample>& problems,
                    const std::vector<std::vector<int>>& prompts) const;

  const StepSamplerConfig config_;
  // The codec first: the task may read it until the task is gone.
  const std::shared_ptr<const engine::text::TextCodec> codec_;
  const std::shared_ptr<const engine::Task> task_;
  const std::vector<rollout::ReplicaStub> replicas_;
  rollout::SampleFanOut& fan_out_;
  Clock& clock_;
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_STEP_SAMPLER_H_
