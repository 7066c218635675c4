#ifndef TANDEM_SERVICES_ROLLOUT_GENERATE_REQUEST_H_
#define TANDEM_SERVICES_ROLLOUT_GENERATE_REQUEST_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/config.h"
#include "engine/text/text_codec.h"
#include "services/rollout/generation_work.h"
#include "tandem/rollout/v1/rollout.pb.h"

namespace tandem::rollout {

// common.proto's AdapterSelector as a rollout reads it: an empty name is the base model (only
// exact_version 0 may then be set); otherwise an identifier, with a version >= 1 when one is
// set. INVALID_ARGUMENT naming the field and value (in its details too: "adapter.min_version").
absl::Status ValidateAdapterSelector(const type::v1::AdapterSelector& selector);

// Checks a GenerateRequest against rollout.proto's rules and the model, and turns it into the
// scheduler's work: prompts tokenized by the model's codec (which must outlive the work), each
// kept once for its group's samples (GenerationWork::Sample builds a sample's engine request
// with its own seed MixSeed(MixSeed(seed, prompt), sample)), and the model's stop tokens (EOS)
// among the stop tokens. INVALID_ARGUMENT naming the field, e.g.
// "prompts[3]: 900 + 200 tokens > context 1024", whose google.rpc.BadRequest names it by its
// path from the request root ("prompts[3].token_ids"); FAILED_PRECONDITION for a text prompt to
// a model without a tokenizer.
absl::StatusOr<std::unique_ptr<GenerationWork>> PrepareWork(
    const rollout::v1::GenerateRequest& request, const engine::ModelConfig& model,
    const engine::text::TextCodec& codec);

}  // namespace tandem::rollout

#endif  // TANDEM_SERVICES_ROLLOUT_GENERATE_REQUEST_H_
