#include "services/rollout/generate_request.h"

#include <cmath>
#include <random>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/adapter_selector.h"
#include "common/identifier.h"
#include "common/status.h"
#include "common/string_limits.h"
#include "engine/sampler.h"
#include "services/rollout/client/sampling_rules.h"
#include "services/router_replay/client/record_key.h"

namespace tandem::rollout {
namespace {

constexpr int kMaxGroupSize = 256;
constexpr size_t kMaxPromptTextBytes = size_t{1} << 20;

// INVALID_ARGUMENT about the GenerateRequest field at `path`.
absl::Status Invalid(const std::string& path, auto&&... parts) {
  return InvalidField(path, absl::StrCat(parts...));
}

// The path of prompts[index] and of its fields.
std::string PromptPath(int index, absl::string_view field) {
  return FieldPath(IndexPath("prompts", index), field);
}

// Where a prompt's tokens come from: its token_ids or its text.
std::string ContentPath(const rollout::v1::Prompt& prompt, int index) {
  return PromptPath(index, prompt.has_text() ? "text" : "token_ids");
}

absl::StatusOr<std::vector<int>> TextTokens(const rollout::v1::Prompt& prompt, int index,
                                            const engine::text::TextCodec& codec) {
  if (prompt.text().empty() || prompt.text().size() > kMaxPromptTextBytes) {
    return Invalid(PromptPath(index, "text"), "prompts[", index, "]: text has ",
                   prompt.text().size(), " bytes; must have 1 byte .. 1 MiB");
  }
  auto ids = codec.EncodePrompt(prompt.text());
  if (!ids.ok()) {
    absl::Status status = Annotate(ids.status(), absl::StrCat("prompts[", index, "]: "));
    // A text the tokenizer refuses is the text's fault; a missing tokenizer is not.
    if (absl::IsInvalidArgument(status) && FieldViolations(status).empty()) {
      status = WithFieldPath(status, PromptPath(index, "text"));
    }
    return status;
  }
  return ids;
}

absl::StatusOr<std::vector<int>> PromptTokens(const rollout::v1::Prompt& prompt, int index,
                                              const engine::ModelConfig& model,
                                              const engine::text::TextCodec& codec) {
  std::vector<int> ids;
  switch (prompt.content_case()) {
    case rollout::v1::Prompt::kTokenIds:
      ids.assign(prompt.token_ids().ids().begin(), prompt.token_ids().ids().end());
      break;
    case rollout::v1::Prompt::kText: {
      auto text_ids = TextTokens(prompt, index, codec);
      if (!text_ids.ok()) return text_ids.status();
      ids = *std::move(text_ids);
      break;
    }
    default:
      // The oneof is required; its name stands for whichever of its fields the client meant.
      return Invalid(PromptPath(index, "content"), "prompts[", index, "]: set token_ids or text");
  }
  for (size_t i = 0; i < ids.size(); ++i) {  // A tokenizer may know ids beyond the vocabulary.
    const int id = ids[i];
    if (id < 0 || id >= model.vocab_size) {
      const std::string path = prompt.has_text() ? PromptPath(index, "text")
                                                 : IndexPath(PromptPath(index, "token_ids.ids"),
                                                             static_cast<int64_t>(i));
      return Invalid(path, "prompts[", index, "]: token ", id,
                     id < 0 ? " < 0" : absl::StrCat(" >= vocab ", model.vocab_size));
    }
  }
  return ids;
}

absl::Status CheckRouteRecording(const rollout::v1::GenerateRequest& request) {
  const rollout::v1::RouteRecording& routes = request.routes();
  if (!routes.enabled()) return absl::OkStatus();
  if (absl::Status status = router_replay::ValidateJobId(routes.job_id(), "routes.job_id");
      !status.ok()) {
    return Annotate(status, "routes.job_id: ");
  }
  if (routes.attempt() < 0) {
    return Invalid("routes.attempt", "routes.attempt is ", routes.attempt(), "; must be >= 0");
  }
  return absl::OkStatus();
}

engine::SamplingConfig SamplingOf(const type::v1::SamplingParams& given) {
  const type::v1::SamplingParams sampling = WithSamplingDefaults(given);
  return {
      .temperature = sampling.temperature(), .top_p = sampling.top_p(), .top_k = sampling.top_k()};
}

}  // namespace

absl::Status ValidateAdapterSelector(const type::v1::AdapterSelector& selector) {
  if (selector.adapter_name().empty()) {
    if (selector.version_case() != type::v1::AdapterSelector::VERSION_NOT_SET &&
        !(selector.has_exact_version() && selector.exact_version() == 0)) {
      const char* field = selector.has_exact_version() ? "adapter.exact_version"
                          : selector.has_min_version() ? "adapter.min_version"
                                                       : "adapter.latest";
      return Invalid(field,
                     "adapter.adapter_name is empty (the base model): only exact_version 0 may be "
                     "set, not ",
                     selector.ShortDebugString());
    }
    return absl::OkStatus();
  }
  // Its errors name their field at its path here ("adapter.min_version").
  return ValidateNamedSelector(selector);
}

absl::StatusOr<std::unique_ptr<GenerationWork>> PrepareWork(
    const rollout::v1::GenerateRequest& request, const engine::ModelConfig& model,
    const engine::text::TextCodec& codec) {
  if (absl::Status status = ValidateIdentifier("request_id", request.request_id()); !status.ok()) {
    return status;
  }
  if (request.prompts_size() < 1 || request.prompts_size() > kMaxPromptsPerRequest) {
    return Invalid("prompts", "prompts has ", request.prompts_size(), " entries; need 1..",
                   kMaxPromptsPerRequest);
  }
  const int group_size = request.group_size() == 0 ? 1 : request.group_size();
  if (group_size < 1 || group_size > kMaxGroupSize) {
    return Invalid("group_size", "group_size is ", request.group_size(), "; must be in 1..",
                   kMaxGroupSize);
  }
  if (!request.has_sampling()) {
    return Invalid("sampling", "sampling is required (max_new_tokens at least)");
  }
  // Checked here, before the request queues and the replica follows the adapter (a watcher
  // per name).
  if (absl::Status status = ValidateAdapterSelector(request.adapter()); !status.ok()) {
    return status;
  }
  const type::v1::SamplingParams& sampling = request.sampling();
  if (absl::Status status = ValidateSampling(sampling, model.vocab_size); !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckRouteRecording(request); !status.ok()) return status;

  auto work = std::make_unique<GenerationWork>();
  work->request_id = request.request_id();
  work->group_size = group_size;
  work->adapter = request.adapter();
  work->allow_version_switch = request.allow_version_switch();
  work->routes = {.enabled = request.routes().enabled(),
                  .job_id = request.routes().job_id(),
                  .attempt = request.routes().attempt()};
  work->seed = sampling.has_seed() ? sampling.seed() : std::random_device()();
  engine::GenerationRequest& shared = work->sample_template;
  shared.max_new_tokens = sampling.max_new_tokens();
  shared.sampling = SamplingOf(sampling);
  shared.stop_tokens = codec.StopTokenIds();
  shared.stop_tokens.insert(shared.stop_tokens.end(), sampling.stop_token_ids().begin(),
                            sampling.stop_token_ids().end());
  absl::flat_hash_set<std::string> prompt_ids;
  for (int i = 0; i < request.prompts_size(); ++i) {
    const rollout::v1::Prompt& prompt = request.prompts(i);
    auto tokens = PromptTokens(prompt, i, model, codec);
    if (!tokens.ok()) return tokens.status();
    const int length = static_cast<int>(tokens->size());
    if (length < 1) {
      return Invalid(prompt.has_text() ? PromptPath(i, "text") : PromptPath(i, "token_ids.ids"),
                     "prompts[", i, "]: empty prompt");
    }
    if (length + int64_t{sampling.max_new_tokens()} > model.max_seq_len) {
      return Invalid(ContentPath(prompt, i), "prompts[", i, "]: ", length, " + ",
                     sampling.max_new_tokens(), " tokens > context ", model.max_seq_len);
    }
    if (absl::Status status = CheckMaxBytes("prompt_id", prompt.prompt_id(), kMaxIdentifierBytes);
        !status.ok()) {
      return Annotate(WithFieldPath(status, PromptPath(i, "prompt_id")),
                      absl::StrCat("prompts[", i, "]: "));
    }
    std::string prompt_id = prompt.prompt_id().empty() ? absl::StrCat(request.request_id(), ".", i)
                                                       : prompt.prompt_id();
    if (!prompt_ids.insert(prompt_id).second) {
      return Invalid(PromptPath(i, "prompt_id"), "prompts[", i, "]: prompt_id '", prompt_id,
                     "' is not unique");
    }
    work->reserved_positions += (length + int64_t{sampling.max_new_tokens()}) * group_size;
    work->prompt_ids.push_back(prompt_id);
    if (request.routes().enabled()) {
      // The prompt's longest sample id: its last sample's.
      const router_replay::RecordKey key = work->RouteKey((i + 1) * group_size - 1, 0);
      if (absl::Status status = router_replay::ValidateRecordKey(key); !status.ok()) {
        // The prompt_id makes the sample ids (an explicit one is the fix).
        return Annotate(WithFieldPath(status, PromptPath(i, "prompt_id")),
                        absl::StrCat("prompts[", i, "]: sample ids '", prompt_id,
                                     "/<j>' are no valid route keys: "));
      }
    }
    work->prompts.push_back(*std::move(tokens));
    work->text_prompts.push_back(prompt.has_text());
    work->codec = &codec;
  }
  return work;
}

}  // namespace tandem::rollout
