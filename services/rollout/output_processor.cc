#include "services/rollout/output_processor.h"

#include "common/utf8.h"

namespace tandem::rollout {
namespace {

rollout::v1::FinishReason FinishReasonOf(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kStop:
      return rollout::v1::FINISH_REASON_STOP;
    case engine::FinishReason::kLength:
      return rollout::v1::FINISH_REASON_LENGTH;
    case engine::FinishReason::kCancelled:
      return rollout::v1::FINISH_REASON_CANCELLED;
    case engine::FinishReason::kError:
      return rollout::v1::FINISH_REASON_ERROR;
  }
  return rollout::v1::FINISH_REASON_UNSPECIFIED;
}

rollout::v1::RouteStatus RouteStatusOf(RouteOutcome outcome) {
  switch (outcome) {
    case RouteOutcome::kNotRequested:
      return rollout::v1::ROUTE_STATUS_NOT_REQUESTED;
    case RouteOutcome::kRecorded:
      return rollout::v1::ROUTE_STATUS_RECORDED;
    case RouteOutcome::kFailed:
      return rollout::v1::ROUTE_STATUS_FAILED;
  }
  return rollout::v1::ROUTE_STATUS_UNSPECIFIED;
}

void SetRouteKey(const router_replay::RecordKey& key, rollout::v1::GenerateResponse& response) {
  type::v1::RouteRecordKey& proto_key = *response.mutable_route_key();
  proto_key.set_job_id(key.job_id);
  proto_key.set_policy_version(key.policy_version);
  proto_key.set_sample_id(key.sample_id);
  proto_key.set_attempt(key.attempt);
}

}  // namespace

rollout::v1::GenerateResponse ToGenerateResponse(const GenerationWork& work,
                                                 const SampleOutput& output) {
  const int prompt = output.sample / work.group_size;
  rollout::v1::GenerateResponse response;
  response.set_request_id(work.request_id);
  response.set_prompt_index(prompt);
  response.set_sample_index(output.sample % work.group_size);
  response.set_prompt_tokens(static_cast<int32_t>(work.prompts[prompt].size()));
  response.mutable_token_ids()->Add(output.tokens.begin(), output.tokens.end());
  response.mutable_logprobs()->Add(output.logprobs.begin(), output.logprobs.end());
  response.mutable_token_adapter_versions()->Add(output.token_versions.begin(),
                                                 output.token_versions.end());
  if (work.text_prompts[prompt] && !output.tokens.empty()) {
    response.set_text(work.codec->Decode(output.tokens));
  }
  response.set_finish_reason(FinishReasonOf(output.finish_reason));
  if (output.finish_reason == engine::FinishReason::kError) {
    response.set_error_message(ValidUtf8(output.error));
  }
  response.set_adapter_version(output.adapter_version);
  response.set_route_status(RouteStatusOf(output.routes));
  if (output.route_key.has_value()) SetRouteKey(*output.route_key, response);
  response.set_route_rows(output.route_rows);
  if (output.routes == RouteOutcome::kFailed) {
    response.set_route_error(ValidUtf8(output.route_error));
  }
  return response;
}

}  // namespace tandem::rollout
