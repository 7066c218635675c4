#ifndef TANDEM_SERVICES_TRAINER_STEP_ROUTES_H_
#define TANDEM_SERVICES_TRAINER_STEP_ROUTES_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/config.h"
#include "services/router_replay/client/route_source.h"
#include "services/trainer/step/step_sampler.h"

namespace tandem::trainer {

// The routes a step replays (R3): every sample's rows as rollout recorded them.
struct StepRoutes {
  std::vector<int16_t> routes;  // The engine's replay layout, samples in StepSamples' order.
  int64_t missing_entries = 0;  // (row, MoE layer) entries router-replay had not: routed live.
  int64_t entries = 0;          // (row, MoE layer) entries asked for.
};

// Fetches them from `source` by the record keys rollout returned with each sample. A record
// missing, unsealed or deleted during the fetch comes back as -1 rows (routed live, counted in
// missing_entries) instead of failing the step.
absl::StatusOr<StepRoutes> FetchStepRoutes(router_replay::RouteSource& source,
                                           const StepSamples& samples,
                                           const engine::ModelConfig& model,
                                           absl::Duration timeout);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_STEP_ROUTES_H_
