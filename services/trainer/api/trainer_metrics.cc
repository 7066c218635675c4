#include "services/trainer/api/trainer_metrics.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"

namespace tandem::trainer {
namespace {

using ::google::protobuf::FieldDescriptor;

// One gauge family per StepMetrics field, made on first use; the step's fields are read by
// reflection, so a field added to the proto is exported without touching this file.
prometheus::Family<prometheus::Gauge>& StepFamily(const FieldDescriptor& field) {
  static auto* families =
      new absl::flat_hash_map<const FieldDescriptor*, prometheus::Family<prometheus::Gauge>*>();
  static absl::Mutex mutex;
  absl::MutexLock lock(&mutex);
  auto& family = (*families)[&field];
  if (family == nullptr) {
    family = &prometheus::BuildGauge()
                  .Name(absl::StrCat("tandem_trainer_", field.name()))
                  .Help(absl::StrCat("StepMetrics.", field.name(), " of the latest step."))
                  .Register(MetricsRegistry());
  }
  return *family;
}

prometheus::Family<prometheus::Gauge>& RankSamples() {
  static auto& family = prometheus::BuildGauge()
                            .Name("tandem_trainer_rank_samples")
                            .Help("Samples each rank trained in the latest step.")
                            .Register(MetricsRegistry());
  return family;
}

prometheus::Family<prometheus::Gauge>& RankTokens() {
  static auto& family = prometheus::BuildGauge()
                            .Name("tandem_trainer_rank_response_tokens")
                            .Help("Response tokens each rank trained in the latest step.")
                            .Register(MetricsRegistry());
  return family;
}

prometheus::Family<prometheus::Gauge>& RankExpertRows() {
  static auto& family =
      prometheus::BuildGauge()
          .Name("tandem_trainer_rank_expert_rows")
          .Help("Routed rows each rank's experts computed in the latest step (expert parallel).")
          .Register(MetricsRegistry());
  return family;
}

prometheus::Family<prometheus::Gauge>& AttemptStart() {
  static auto& family = prometheus::BuildGauge()
                            .Name("tandem_trainer_job_attempt_start_time_seconds")
                            .Help("When the running attempt of a job started (Unix seconds).")
                            .Register(MetricsRegistry());
  return family;
}

// What the removal of jobs' series needs: the ranks each job's series are labelled with, and the
// ended jobs whose series go at a later time.
struct JobSeries {
  absl::Mutex mutex;
  absl::flat_hash_map<std::string, int> ranks ABSL_GUARDED_BY(mutex);
  std::vector<std::pair<absl::Time, std::string>> retiring ABSL_GUARDED_BY(mutex);
};

JobSeries& TrackedJobs() {
  static auto* jobs = new JobSeries();
  return *jobs;
}

std::map<std::string, std::string> RankLabels(const std::string& job_id, int rank) {
  return {{"job_id", job_id}, {"rank", absl::StrCat(rank)}};
}

template <typename Metric>
void RemoveSeries(prometheus::Family<Metric>& family,
                  const std::map<std::string, std::string>& labels) {
  if (family.Has(labels)) family.Remove(&family.Add(labels));
}

void RemoveJobSeries(const std::string& job_id) {
  const std::map<std::string, std::string> labels = {{"job_id", job_id}};
  const auto* descriptor = trainer::v1::StepMetrics::descriptor();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    if (!descriptor->field(i)->is_repeated())
      RemoveSeries(StepFamily(*descriptor->field(i)), labels);
  }
  RemoveSeries(AttemptStart(), labels);
  int ranks = 0;
  {
    JobSeries& jobs = TrackedJobs();
    absl::MutexLock lock(&jobs.mutex);
    if (auto found = jobs.ranks.find(job_id); found != jobs.ranks.end()) {
      ranks = found->second;
      jobs.ranks.erase(found);
    }
  }
  for (int rank = 0; rank < ranks; ++rank) {
    RemoveSeries(RankSamples(), RankLabels(job_id, rank));
    RemoveSeries(RankTokens(), RankLabels(job_id, rank));
    RemoveSeries(RankExpertRows(), RankLabels(job_id, rank));
  }
}

// tandem_trainer_jobs_ended_total with every terminal state from the start, at 0: an alert on
// its increase then also sees the first failure after a restart.
prometheus::Family<prometheus::Counter>& JobsEnded() {
  static auto& family = []() -> prometheus::Family<prometheus::Counter>& {
    auto& made = prometheus::BuildCounter()
                     .Name("tandem_trainer_jobs_ended_total")
                     .Help("Jobs that reached a terminal state, by that state.")
                     .Register(MetricsRegistry());
    for (trainer::v1::JobState state :
         {trainer::v1::JOB_STATE_SUCCEEDED, trainer::v1::JOB_STATE_FAILED,
          trainer::v1::JOB_STATE_CANCELLED}) {
      made.Add({{"state", trainer::v1::JobState_Name(state)}});
    }
    return made;
  }();
  return family;
}

}  // namespace

void RecordAttemptStart(const std::string& job_id, absl::Time start) {
  AttemptStart().Add({{"job_id", job_id}}).Set(absl::ToDoubleSeconds(start - absl::UnixEpoch()));
}

void RecordStepMetrics(const std::string& job_id, const trainer::v1::StepMetrics& metrics) {
  RemoveRetiredJobSeries(absl::Now());
  const auto* descriptor = trainer::v1::StepMetrics::descriptor();
  const auto* reflection = trainer::v1::StepMetrics::GetReflection();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor& field = *descriptor->field(i);
    if (field.is_repeated()) continue;  // ranks: below.
    const double value = field.cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE
                             ? reflection->GetDouble(metrics, &field)
                             : static_cast<double>(reflection->GetInt64(metrics, &field));
    StepFamily(field).Add({{"job_id", job_id}}).Set(value);
  }
  for (const trainer::v1::RankShare& share : metrics.ranks()) {
    RankSamples().Add(RankLabels(job_id, share.rank())).Set(static_cast<double>(share.samples()));
    RankTokens()
        .Add(RankLabels(job_id, share.rank()))
        .Set(static_cast<double>(share.response_tokens()));
    RankExpertRows()
        .Add(RankLabels(job_id, share.rank()))
        .Set(static_cast<double>(share.expert_rows()));
  }
  JobSeries& jobs = TrackedJobs();
  absl::MutexLock lock(&jobs.mutex);
  int& most = jobs.ranks[job_id];
  most = std::max(most, metrics.ranks_size());
}

void RecordJobCounts(const std::vector<trainer::v1::Job>& jobs) {
  static auto& family = prometheus::BuildGauge()
                            .Name("tandem_trainer_jobs")
                            .Help("Jobs known to the trainer, by state.")
                            .Register(MetricsRegistry());
  JobsEnded();  // Exported from the first count on, before any job ends.
  absl::flat_hash_map<int, int> counts;
  for (const trainer::v1::Job& job : jobs) ++counts[job.state()];
  for (int state = trainer::v1::JOB_STATE_QUEUED; state <= trainer::v1::JOB_STATE_CANCELLED;
       ++state) {
    family.Add({{"state", trainer::v1::JobState_Name(static_cast<trainer::v1::JobState>(state))}})
        .Set(counts[state]);
  }
}

void RecordJobEnded(trainer::v1::JobState state) {
  JobsEnded().Add({{"state", trainer::v1::JobState_Name(state)}}).Increment();
}

void ForgetJobMetrics(const std::string& job_id, absl::Time now, absl::Duration grace) {
  // Gone at once: the attempt's start, on which "no step lately" alerts hang.
  RemoveSeries(AttemptStart(), {{"job_id", job_id}});
  if (grace <= absl::ZeroDuration()) {
    RemoveJobSeries(job_id);
  } else {
    JobSeries& jobs = TrackedJobs();
    absl::MutexLock lock(&jobs.mutex);
    jobs.retiring.emplace_back(now + grace, job_id);
  }
  RemoveRetiredJobSeries(now);
}

void RemoveRetiredJobSeries(absl::Time now) {
  std::vector<std::string> due;
  {
    JobSeries& jobs = TrackedJobs();
    absl::MutexLock lock(&jobs.mutex);
    auto& retiring = jobs.retiring;
    for (auto it = retiring.begin(); it != retiring.end();) {
      if (it->first > now) {
        ++it;
        continue;
      }
      due.push_back(std::move(it->second));
      it = retiring.erase(it);
    }
  }
  for (const std::string& job_id : due) RemoveJobSeries(job_id);
}

EndedJobSeriesSweeper::EndedJobSeriesSweeper() : thread_([this] { Sweep(); }) {}

EndedJobSeriesSweeper::~EndedJobSeriesSweeper() {
  {
    absl::MutexLock lock(&mutex_);
    stopping_ = true;
  }
  thread_.join();
}

void EndedJobSeriesSweeper::Sweep() {
  constexpr absl::Duration kInterval = absl::Seconds(1);
  absl::MutexLock lock(&mutex_);
  while (!mutex_.AwaitWithTimeout(absl::Condition(&stopping_), kInterval)) {
    RemoveRetiredJobSeries(absl::Now());
  }
}

}  // namespace tandem::trainer
