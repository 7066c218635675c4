#ifndef TANDEM_SERVICES_ROLLOUT_GENERATION_WORK_H_
#define TANDEM_SERVICES_ROLLOUT_GENERATION_WORK_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/generator.h"
#include "engine/text/text_codec.h"
#include "tandem/v1/rollout.pb.h"

namespace tandem::rollout {

// One validated Generate call as the scheduler runs it: every sample's engine request, where
// its results go, and whether its client is still there.
struct GenerationWork {
  v1::GenerateRequest request;          // Prompts cleared once tokenized; the rest as sent.
  std::vector<std::string> prompt_ids;  // Per prompt: names its samples' route records.
  std::vector<int> prompt_tokens;       // Per prompt.
  std::vector<bool> text_prompts;       // Per prompt: answer with text too.
  const engine::text::TextCodec* codec = nullptr;  // The served model's; decodes those answers.
  std::vector<engine::GenerationRequest> samples;  // prompt-major: prompt i, sample j at i*n+j.
  int64_t reserved_positions = 0;                  // KV positions all samples reserve together.
  absl::Time start;
  absl::Time deadline = absl::InfiniteFuture();

  // Set by the transport when the client goes away; the scheduler then drops the samples.
  std::atomic<bool> cancelled{false};
  // One call per finished sample (from the delivery thread), then none after `fail`.
  std::function<void(v1::GenerateResponse)> deliver;
  // Ends the call with an error; at most once, and no `deliver` after it.
  std::function<void(absl::Status)> fail;

  int group_size() const { return request.group_size(); }
  int num_samples() const { return static_cast<int>(samples.size()); }
};

}  // namespace tandem::rollout

#endif  // TANDEM_SERVICES_ROLLOUT_GENERATION_WORK_H_
