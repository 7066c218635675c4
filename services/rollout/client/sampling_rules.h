#ifndef TANDEM_SERVICES_ROLLOUT_CLIENT_SAMPLING_RULES_H_
#define TANDEM_SERVICES_ROLLOUT_CLIENT_SAMPLING_RULES_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "tandem/rollout/v1/rollout.pb.h"

namespace tandem::rollout {

// GenerateRequest's limit on prompts (rollout.proto): a caller with more splits them.
inline constexpr int kMaxPromptsPerRequest = 4096;

// `sampling` with the defaults rollout.proto gives written out: temperature 1, top_p 1. What the
// rollout samples with and what Job.spec shows.
type::v1::SamplingParams WithSamplingDefaults(type::v1::SamplingParams sampling);

// SamplingParams' rules (rollout.proto) for a model of `vocab_size` tokens: max_new_tokens >= 1,
// temperature in [0, 100], top_p in (0, 1], top_k in [0, vocab_size], at most 64 stop tokens
// in [0, vocab_size). NaN is outside every range. INVALID_ARGUMENT names the field and its
// value, e.g. "sampling.top_p is 0; must be in (0, 1]", and its details name the field at its
// path from the request root, `path` being the SamplingParams' ("sampling" in a
// GenerateRequest, "spec.sampling" in a JobSpec): "sampling.stop_token_ids[2]". Rollout checks
// each Generate with it, the trainer each job spec (at CreateJob with any vocabulary, then at
// the job's start with the base model's), so a job does not fail at its first step for a spec
// it accepted.
absl::Status ValidateSampling(const type::v1::SamplingParams& sampling, int vocab_size,
                              absl::string_view path = "sampling");

}  // namespace tandem::rollout

#endif  // TANDEM_SERVICES_ROLLOUT_CLIENT_SAMPLING_RULES_H_
