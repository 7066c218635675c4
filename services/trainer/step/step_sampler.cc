#include "services/trainer/step/step_sampler.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "engine/sampler.h"

namespace tandem::trainer {

absl::StatusOr<StepSamples> StepSampler::Generate(int64_t step, int64_t version) {
  const trainer::v1::JobSpec& spec = *config_.spec;
  const std::vector<engine::Sample> problems =
      engine::GeneratePrompts(*task_, spec.prompts_per_step(), engine::MixSeed(spec.seed(), step));
  std::vector<std::vector<int>> prompts;
  for (const int own : config_.own_groups) {
    auto ids = codec_->EncodePrompt(problems[own].prompt);
    if (!ids.ok()) return ids.status();
    prompts.push_back(*std::move(ids));
  }
  absl::StatusOr<std::vector<rollout::v1::GenerateResponse>> responses;
  absl::Duration backoff = config_.retry_backoff;
  for (int attempt = 0;; ++attempt) {
    responses = RequestSamples(step, version, attempt, prompts);
    if (responses.ok() || !absl::IsUnavailable(responses.status()) ||
        attempt + 1 >= config_.attempts || fan_out_.abandoned()) {
      break;
    }
    spdlog::warn("job {} step {}: {}; retrying in {}", config_.job_id, step,
                 responses.status().ToString(), absl::FormatDuration(backoff));
    clock_.SleepFor(backoff);
    backoff *= 2;
  }
  if (!responses.ok()) return responses.status();
  return Score(*std::move(responses), problems, prompts);
}

absl::StatusOr<std::vector<rollout::v1::GenerateResponse>> StepSampler::RequestSamples(
    int64_t step, int64_t version, int attempt, const std::vector<std::vector<int>>& prompts) {
  const rollout::FanOutCall call{
      .num_prompts = static_cast<int>(prompts.size()),
      .group_size = config_.spec->group_size(),
      .request_id_prefix = absl::StrCat(config_.job_id, "-s", step, "-v", version, "-d",
                                        config_.data_parallel_rank, "-a", attempt),
      .timeout = config_.rpc_timeout};
  return fan_out_.Generate(replicas_, call, [&](int first, int end) {
    return RequestFor(step, version, attempt, first, end, prompts);
  });
}

rollout::v1::GenerateRequest StepSampler::RequestFor(
    int64_t step, int64_t version, int attempt, int first, int end,
    const std::vector<std::vector<int>>& prompt_ids) const {
  const trainer::v1::JobSpec& spec = *config_.spec;
  rollout::v1::GenerateRequest request;
  for (int p = first; p < end; ++p) {
    rollout::v1::Prompt& prompt = *request.add_prompts();
    prompt.mutable_token_ids()->mutable_ids()->Add(prompt_ids[p].begin(), prompt_ids[p].end());
    prompt.set_prompt_id(absl::StrCat("s", step, ".p", config_.own_groups[p]));
  }
  request.set_group_size(spec.group_size());
  *request.mutable_sampling() = spec.sampling();
  // The rollout seeds a request's samples by their index in it; a request's seed of its first
  // prompt's step-wide number keeps every request's streams apart (across replicas and ranks).
  request.mutable_sampling()->set_seed(
      engine::MixSeed(engine::MixSeed(spec.seed(), step), config_.own_groups[first]));
  request.mutable_adapter()->set_adapter_name(spec.adapter_name());
  request.mutable_adapter()->set_exact_version(version);
  request.set_allow_version_switch(spec.partial_rollouts());
  if (config_.record_routes) {
    request.mutable_routes()->set_enabled(true);
    request.mutable_routes()->set_job_id(config_.job_id);
    request.mutable_routes()->set_attempt(attempt);  // A retry never overwrites routes.
  }
  return request;
}

StepSamples StepSampler::Score(std::vector<rollout::v1::GenerateResponse> responses,
                               const std::vector<engine::Sample>& problems,
                               const std::vector<std::vector<int>>& prompts) const {
  const int group = config_.spec->group_size();
  StepSamples samples;
  samples.responses = std::move(responses);
  for (size_t i = 0; i < samples.responses.size(); ++i) {
    const rollout::v1::GenerateResponse& response = samples.responses[i];
    const int own = config_.own_groups[i / group];
    const engine::Sample& problem = problems[own];
    TrainingSample& sample = samples.training.emplace_back();
    sample.prompt = prompts[i / group];
    sample.response.assign(response.token_ids().begin(), response.token_ids().end());
    sample.rollout_logprobs.assign(response.logprobs().begin(), response.logprobs().end());
    sample.group = own;
    sample.reward = task_->Reward(problem.prompt, codec_->DecodeCompletion(sample.response));
    sample.truncated = response.finish_reason() == rollout::v1::FINISH_REASON_LENGTH;
    samples.correct += sample.reward >= 1;
    samples.reward += sample.reward;
    samples.length += static_cast<double>(sample.response.size());
    samples.truncated += sample.truncated;
    const auto& versions = response.token_adapter_versions();
    samples.partial += !versions.empty() && versions[versions.size() - 1] > versions[0];
  }
  return samples;
}

}  // namespace tandem::trainer
