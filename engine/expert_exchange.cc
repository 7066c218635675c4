#include "engine/expert_exchange.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace tandem::engine {
namespace {

void CopyRows(const ExchangePlan& plan, const float* from, int width, float* to) {
  std::copy_n(from, int64_t{plan.local_offsets.back()} * width, to);
}

}  // namespace

absl::Status CheckExpertOffsets(const std::vector<int>& expert_offsets, int num_experts) {
  if (static_cast<int>(expert_offsets.size()) != num_experts + 1) {
    return absl::InvalidArgumentError(absl::StrCat("expert offsets name ",
                                                   static_cast<int>(expert_offsets.size()) - 1,
                                                   " experts; the model has ", num_experts));
  }
  return absl::OkStatus();
}

absl::StatusOr<ExchangePlan> AllExpertsLocal::Plan(const std::vector<int>& expert_offsets) {
  if (absl::Status status = CheckExpertOffsets(expert_offsets, num_experts_); !status.ok()) {
    return status;
  }
  return ExchangePlan{.local_offsets = expert_offsets};
}

absl::Status AllExpertsLocal::Dispatch(const ExchangePlan& plan, const float* rows, int width,
                                       float* local_rows) {
  CopyRows(plan, rows, width, local_rows);
  return absl::OkStatus();
}

absl::Status AllExpertsLocal::Combine(const ExchangePlan& plan, const float* local_rows, int width,
                                      float* rows) {
  CopyRows(plan, local_rows, width, rows);
  return absl::OkStatus();
}

}  // namespace tandem::engine
