#include "services/trainer/trainer_metrics.h"

#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/metrics.h"
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

}  // namespace

void RecordStepMetrics(const std::string& job_id, const v1::StepMetrics& metrics) {
  const auto* descriptor = v1::StepMetrics::descriptor();
  const auto* reflection = v1::StepMetrics::GetReflection();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor& field = *descriptor->field(i);
    if (field.is_repeated()) continue;  // ranks: below.
    const double value = field.cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE
                             ? reflection->GetDouble(metrics, &field)
                             : static_cast<double>(reflection->GetInt64(metrics, &field));
    StepFamily(field).Add({{"job_id", job_id}}).Set(value);
  }
  static auto& rank_samples =
      prometheus::BuildGauge()
          .Name("tandem_trainer_rank_samples")
          .Help("Samples each data-parallel rank trained in the latest step.")
          .Register(MetricsRegistry());
  static auto& rank_tokens =
      prometheus::BuildGauge()
          .Name("tandem_trainer_rank_response_tokens")
          .Help("Response tokens each data-parallel rank trained in the latest step.")
          .Register(MetricsRegistry());
  for (const v1::RankShare& share : metrics.ranks()) {
    const std::map<std::string, std::string> labels = {{"job_id", job_id},
                                                       {"rank", absl::StrCat(share.rank())}};
    rank_samples.Add(labels).Set(static_cast<double>(share.samples()));
    rank_tokens.Add(labels).Set(static_cast<double>(share.response_tokens()));
  }
}

void RecordJobCounts(const std::vector<v1::Job>& jobs) {
  static auto& family = prometheus::BuildGauge()
                            .Name("tandem_trainer_jobs")
                            .Help("Jobs known to the trainer, by state.")
                            .Register(MetricsRegistry());
  absl::flat_hash_map<int, int> counts;
  for (const v1::Job& job : jobs) ++counts[job.state()];
  for (int state = v1::JOB_STATE_QUEUED; state <= v1::JOB_STATE_CANCELLED; ++state) {
    family.Add({{"state", v1::JobState_Name(static_cast<v1::JobState>(state))}}).Set(counts[state]);
  }
}

}  // namespace tandem::trainer
