#include "services/trainer/step/step_routes.h"

#include <utility>

namespace tandem::trainer {

absl::StatusOr<StepRoutes> FetchStepRoutes(router_replay::RouteSource& source,
                                           const StepSamples& samples,
                                           const engine::ModelConfig& model,
                                           absl::Duration timeout) {
  std::vector<router_replay::ReplaySequence> sequences;
  int64_t rows = 0;
  for (const rollout::v1::GenerateResponse& response : samples.responses) {
    const type::v1::RouteRecordKey& key = response.route_key();
    const int64_t tokens = response.prompt_tokens() + response.token_ids_size();
    sequences.push_back(
        {{key.job_id(), key.policy_version(), key.sample_id(), key.attempt()}, tokens});
    rows += tokens - 1;
  }
  auto fetched = source.Fetch(sequences, {.moe_layers = model.MoeLayerIndices(),
                                          .top_k = model.top_k,
                                          .num_experts = model.num_experts,
                                          .allow_partial = true,
                                          .timeout = timeout});
  if (!fetched.ok()) return fetched.status();
  return StepRoutes{.routes = std::move(fetched->routes),
                    .missing_entries = fetched->missing_entries,
                    .entries = rows * model.num_moe_layers()};
}

}  // namespace tandem::trainer
