#ifndef TANDEM_SERVICES_TRAINER_TRAINER_METRICS_H_
#define TANDEM_SERVICES_TRAINER_TRAINER_METRICS_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "tandem/trainer/v1/trainer.pb.h"

namespace tandem::trainer {

// Exports a completed step as Prometheus gauges, one per StepMetrics field:
// tandem_trainer_<field>{job_id="<id>"} (e.g. tandem_trainer_reward_mean, _mismatch_kl_k3,
// _generation_seconds), in MetricsRegistry().
void RecordStepMetrics(const std::string& job_id, const trainer::v1::StepMetrics& metrics);

// tandem_trainer_job_attempt_start_time_seconds{job_id}: when the job's running attempt started.
void RecordAttemptStart(const std::string& job_id, absl::Time start);

// A job ended or resumes: its attempt's start goes at once (so that no alert thinks it still
// runs); its step and rank series at `now + grace`, once scrapes have seen its last step (zero
// grace: at once). Job ids do not pile up, and per-job alerts resolve.
void ForgetJobMetrics(const std::string& job_id, absl::Time now, absl::Duration grace);
// Removes the series of ended jobs whose grace is over by `now` (every other call does too).
void RemoveRetiredJobSeries(absl::Time now);

// tandem_trainer_jobs{state} for the current counts.
void RecordJobCounts(const std::vector<trainer::v1::Job>& jobs);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_TRAINER_METRICS_H_
