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

absl::StatusOr<ExchangePlan> AllExpertsLocal::Plan(const std::vector<int>& expert_offsets) {
  if (static_cast<int>(expert_offsets.size()) != num_experts_ + 1) {
    return absl::InvalidArgumentError(absl::StrCat("expert offsets name ",
                                                   expert_offsets.size() - 1, " experts; the ",
                                                   "model has ", num_experts_));
  }
  return ExchangePlan{expert_offsets};
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
