#ifndef TANDEM_SERVICES_TRAINER_TRAINER_METRICS_H_
#define TANDEM_SERVICES_TRAINER_TRAINER_METRICS_H_

#include <string>

#include "tandem/v1/trainer.pb.h"

namespace tandem::trainer {

// Exports a completed step as Prometheus gauges, one per StepMetrics field:
// tandem_trainer_<field>{job_id="<id>"} (e.g. tandem_trainer_reward_mean, _mismatch_kl_k3,
// _generation_seconds), in MetricsRegistry().
void RecordStepMetrics(const std::string& job_id, const v1::StepMetrics& metrics);

// tandem_trainer_jobs{state} for the current counts.
void RecordJobCounts(const std::vector<v1::Job>& jobs);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_TRAINER_METRICS_H_
