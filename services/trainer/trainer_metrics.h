#ifndef TANDEM_SERVICES_TRAINER_TRAINER_METRICS_H_
#define TANDEM_SERVICES_TRAINER_TRAINER_METRICS_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "tandem/v1/trainer.pb.h"

namespace tandem::trainer {

// Exports a completed step as Prometheus gauges, one per StepMetrics field:
// tandem_trainer_<field>{job_id="<id>"} (e.g. tandem_trainer_reward_mean, _mismatch_kl_k3,
// _generation_seconds), in MetricsRegistry().
void RecordStepMetrics(const std::string& job_id, const v1::StepMetrics& metrics);

// tandem_trainer_job_attempt_start_time_seconds{job_id}: when the job's running attempt started.
void RecordAttemptStart(const std::string& job_id, absl::Time start);

// Removes every series of `job_id` (its step gauges, its ranks', its attempt start): a job that
// ended leaves no series behind (alerts on them resolve, and job ids do not pile up).
void ForgetJobMetrics(const std::string& job_id);

// tandem_trainer_jobs{state} for the current counts.
void RecordJobCounts(const std::vector<v1::Job>& jobs);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_TRAINER_METRICS_H_
