#ifndef TANDEM_SERVICES_TRAINER_STEP_METRICS_H_
#define TANDEM_SERVICES_TRAINER_STEP_METRICS_H_

#include <cstdint>
#include <vector>

#include "services/trainer/step/step_sampler.h"
#include "services/trainer/update/policy_update.h"
#include "tandem/trainer/v1/trainer.pb.h"

namespace tandem::trainer {

// What one rank's share of a step adds up to (kTallies values): gathered from every rank
// (rank-major) into the step's metrics.
enum Tally {
  kSamples,
  kResponseTokens,
  kCorrect,
  kReward,
  kLength,
  kTruncated,
  kPartial,
  kMissingRouteEntries,
  kRouteEntries,
  kExpertRows,
  kExpertSeconds,
  kTallies
};

// What a rank's experts did in a step (expert parallelism; else zeros).
struct ExpertWork {
  int64_t rows = 0;    // Routed rows they computed.
  double seconds = 0;  // Time they computed.
};

// This rank's tallies of a step: its samples, the route entries it replayed (entries) of which
// router-replay had none (missing: routed live), and its experts' work.
std::vector<float> TalliesOf(const StepSamples& samples, int64_t missing_route_entries,
                             int64_t route_entries, ExpertWork experts = {});

// The step's sample metrics and each rank's share, from every rank's tallies (rank-major).
void SetSampleMetrics(const std::vector<float>& tallies, trainer::v1::StepMetrics& metrics);

// The step's training metrics, from the policy update's statistics.
void SetUpdateMetrics(const UpdateStats& stats, trainer::v1::StepMetrics& metrics);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_STEP_METRICS_H_
