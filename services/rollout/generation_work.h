#ifndef TANDEM_SERVICES_ROLLOUT_GENERATION_WORK_H_
#define TANDEM_SERVICES_ROLLOUT_GENERATION_WORK_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "engine/generator.h"
#include "engine/sampler.h"
#include "engine/text/text_codec.h"
#include "services/rollout/sample_output.h"
#include "services/router_replay/client/record_key.h"
#include "tandem/type/v1/common.pb.h"

namespace tandem::rollout {

// One validated Generate call as the scheduler runs it: every sample's engine request, where
// its results go, and whether its client is still there.
struct GenerationWork {
  // Where a request's samples record their routes (RouteRecording, validated).
  struct RouteRecording {
    bool enabled = false;
    std::string job_id;
    int32_t attempt = 0;
  };

  std::string request_id;
  int group_size = 1;
  type::v1::AdapterSelector adapter;  // Validated; resolved by the replica's ServedModels.
  bool allow_version_switch = false;
  RouteRecording routes;
  std::vector<std::string> prompt_ids;    // Per prompt: names its samples' route records.
  std::vector<std::vector<int>> prompts;  // Per prompt: its tokens, shared by its samples.
  std::vector<bool> text_prompts;         // Per prompt: answer with text too.
  const engine::text::TextCodec* codec = nullptr;  // The served model's; decodes those answers.
  // What every sample's engine request holds but its prompt and seed.
  engine::GenerationRequest sample_template;
  uint64_t seed = 0;               // The request's; each sample's is mixed from it.
  int64_t reserved_positions = 0;  // KV positions all samples reserve together.
  absl::Time start;
  absl::Time deadline = absl::InfiniteFuture();

  // Set by the transport when the client goes away; the scheduler then drops the samples.
  std::atomic<bool> cancelled{false};
  // One call per finished sample (from the delivery thread), then none after `fail`.
  std::function<void(SampleOutput)> deliver;
  // Ends the call with an error; at most once, and no `deliver` after it.
  std::function<void(absl::Status)> fail;

  // Prompt-major: sample s is sample s % n of prompt s / n, for n = group_size.
  int num_samples() const { return static_cast<int>(prompts.size()) * group_size; }
  // Sample s's engine request, with its prompt and its own seed
  // MixSeed(MixSeed(seed, prompt), sample). Built when the scheduler admits the sample, so
  // samples waiting in the queue hold no copy of their prompt: a request of many large groups
  // costs its prompts once, not once per sample.
  engine::GenerationRequest Sample(int s) const {
    engine::GenerationRequest sample = sample_template;
    sample.prompt = prompts[s / group_size];
    sample.seed = engine::MixSeed(engine::MixSeed(seed, s / group_size), s % group_size);
    return sample;
  }
  // The route record of sample s produced by adapter `version`: sample_id "<prompt_id>/<j>".
  router_replay::RecordKey RouteKey(int s, int64_t version) const {
    return {routes.job_id, version, absl::StrCat(prompt_ids[s / group_size], "/", s % group_size),
            routes.attempt};
  }
  // KV positions sample s reserves: its prompt and its new tokens.
  int64_t Positions(int s) const {
    return static_cast<int64_t>(prompts[s / group_size].size()) + sample_template.max_new_tokens;
  }
};

}  // namespace tandem::rollout

#endif  // TANDEM_SERVICES_ROLLOUT_GENERATION_WORK_H_
