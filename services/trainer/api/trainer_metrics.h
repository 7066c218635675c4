#ifndef TANDEM_SERVICES_TRAINER_TRAINER_METRICS_H_
#define TANDEM_SERVICES_TRAINER_TRAINER_METRICS_H_

#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
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

// tandem_trainer_jobs_ended_total{state}: a job reached SUCCEEDED, FAILED or CANCELLED.
void RecordJobEnded(trainer::v1::JobState state);

// Removes ended jobs' series once their grace is over (RemoveRetiredJobSeries, about once a
// second) on a thread of its own, so that they go even when no other job runs after them.
class EndedJobSeriesSweeper {
 public:
  EndedJobSeriesSweeper();
  ~EndedJobSeriesSweeper();
  EndedJobSeriesSweeper(const EndedJobSeriesSweeper&) = delete;
  EndedJobSeriesSweeper& operator=(const EndedJobSeriesSweeper&) = delete;

 private:
  void Sweep();

  absl::Mutex mutex_;
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread thread_;
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_TRAINER_METRICS_H_
