#include "tools/cli/step_metrics_tsv.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace tandem::cli {
namespace {

using ::google::protobuf::FieldDescriptor;

std::string Value(const trainer::v1::StepMetrics& metrics, const FieldDescriptor& field) {
  const auto& reflection = *metrics.GetReflection();
  switch (field.cpp_type()) {
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return absl::StrFormat("%.10g", reflection.GetDouble(metrics, &field));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return absl::StrFormat("%.7g", reflection.GetFloat(metrics, &field));
    case FieldDescriptor::CPPTYPE_INT64:
      return absl::StrCat(reflection.GetInt64(metrics, &field));
    case FieldDescriptor::CPPTYPE_INT32:
      return absl::StrCat(reflection.GetInt32(metrics, &field));
    default:  // StepMetrics holds numbers only; anything else would not plot.
      return "";
  }
}

// The columns: every field that holds one number (a rank's share is in Job.latest_metrics).
std::vector<const FieldDescriptor*> Columns() {
  const auto& descriptor = *trainer::v1::StepMetrics::descriptor();
  std::vector<const FieldDescriptor*> columns;
  for (int i = 0; i < descriptor.field_count(); ++i) {
    if (!descriptor.field(i)->is_repeated()) columns.push_back(descriptor.field(i));
  }
  return columns;
}

}  // namespace

std::string StepMetricsTsvHeader() {
  std::vector<std::string> names;
  for (const FieldDescriptor* field : Columns()) names.push_back(field->name());
  return absl::StrJoin(names, "\t");
}

std::string StepMetricsTsvRow(const trainer::v1::StepMetrics& metrics) {
  std::vector<std::string> values;
  for (const FieldDescriptor* field : Columns()) values.push_back(Value(metrics, *field));
  return absl::StrJoin(values, "\t");
}

}  // namespace tandem::cli
