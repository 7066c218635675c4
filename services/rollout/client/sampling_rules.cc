#include "services/rollout/client/sampling_rules.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::rollout {
namespace {

constexpr int kMaxStopTokens = 64;

// INVALID_ARGUMENT about the field at `path`.
absl::Status Invalid(const std::string& path, auto&&... parts) {
  return InvalidField(path, absl::StrCat(parts...));
}

}  // namespace

type::v1::SamplingParams WithSamplingDefaults(type::v1::SamplingParams sampling) {
  if (!sampling.has_temperature()) sampling.set_temperature(1.0f);
  if (!sampling.has_top_p()) sampling.set_top_p(1.0f);
  return sampling;
}

absl::Status ValidateSampling(const type::v1::SamplingParams& given, int vocab_size,
                              absl::string_view path) {
  const type::v1::SamplingParams sampling = WithSamplingDefaults(given);
  if (sampling.max_new_tokens() < 1) {
    return Invalid(FieldPath(path, "max_new_tokens"), "sampling.max_new_tokens is ",
                   sampling.max_new_tokens(), "; must be >= 1");
  }
  const float temperature = sampling.temperature();
  if (!(temperature >= 0 && temperature <= 100)) {
    return Invalid(FieldPath(path, "temperature"), "sampling.temperature is ", temperature,
                   "; must be in [0, 100]");
  }
  const float top_p = sampling.top_p();
  if (!(top_p > 0 && top_p <= 1)) {
    return Invalid(FieldPath(path, "top_p"), "sampling.top_p is ", top_p, "; must be in (0, 1]");
  }
  if (sampling.top_k() < 0 || sampling.top_k() > vocab_size) {
    return Invalid(FieldPath(path, "top_k"), "sampling.top_k is ", sampling.top_k(),
                   "; must be in [0, ", vocab_size, "]");
  }
  const std::string stop_path = FieldPath(path, "stop_token_ids");
  if (sampling.stop_token_ids_size() > kMaxStopTokens) {
    return Invalid(stop_path, "sampling.stop_token_ids has ", sampling.stop_token_ids_size(),
                   " ids; at most ", kMaxStopTokens);
  }
  for (int i = 0; i < sampling.stop_token_ids_size(); ++i) {
    const int id = sampling.stop_token_ids(i);
    if (id < 0 || id >= vocab_size) {
      return Invalid(IndexPath(stop_path, i), "sampling.stop_token_ids: ", id, " is outside [0, ",
                     vocab_size, ")");
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::rollout
