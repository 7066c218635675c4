#ifndef TANDEM_SERVICES_ROLLOUT_SAMPLE_OUTPUT_H_
#define TANDEM_SERVICES_ROLLOUT_SAMPLE_OUTPUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/generator.h"
#include "services/router_replay/client/record_key.h"

namespace tandem::rollout {

// What became of a sample's routes.
enum class RouteOutcome {
  kNotRequested,  // The request did not ask for them.
  kRecorded,      // router-replay acknowledged every row.
  kFailed,        // Not (all) recorded; route_error says why.
};

// One finished sample as the scheduler hands it over, in the replica's own types; the front
// end's output processor (ToGenerateResponse) makes the API's message of it.
struct SampleOutput {
  int sample = 0;               // Prompt-major index in its request.
  std::vector<int> tokens;      // Generated tokens.
  std::vector<float> logprobs;  // Per generated token.
  // Per generated token, the adapter version it came from; empty unless the request allowed
  // version switches.
  std::vector<int64_t> token_versions;
  engine::FinishReason finish_reason = engine::FinishReason::kLength;
  std::string error;            // With kError.
  int64_t adapter_version = 0;  // The version that prefilled it (0: the base model).
  RouteOutcome routes = RouteOutcome::kNotRequested;
  std::optional<router_replay::RecordKey> route_key;  // With routes requested.
  int64_t route_rows = 0;                             // Rows recorded (0 unless kRecorded).
  std::string route_error;                            // With kFailed.
};

}  // namespace tandem::rollout

#endif  // TANDEM_SERVICES_ROLLOUT_SAMPLE_OUTPUT_H_
