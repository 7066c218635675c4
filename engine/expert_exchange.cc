#include "engine/expert_exchange.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace tandem::engine {

absl::Status CheckExpertOffsets(const std::vector<int>& expert_offsets, int num_experts) {
  if (static_cast<int>(expert_offsets.size()) != num_experts + 1) {
    return absl::InvalidArgumentError(absl::StrCat("expert offsets name ",
                                                   static_cast<int>(expert_offsets.size()) - 1,
                                                   " experts; the model has ", num_experts));
  }
  if (expert_offsets[0] != 0 || !std::is_sorted(expert_offsets.begin(), expert_offsets.end())) {
    return absl::InvalidArgumentError("expert offsets must start at 0 and never decrease");
  }
  return absl::OkStatus();
}

namespace {

LocalExperts Every(int num_experts) {
  LocalExperts local{.experts = std::vector<int>(num_experts)};
  std::iota(local.experts.begin(), local.experts.end(), 0);
  return local;
}

}  // namespace

AllExpertsLocal::AllExpertsLocal(int num_experts)
    : num_experts_(num_experts), local_(Every(num_experts)) {}

absl::StatusOr<ExchangePlan> AllExpertsLocal::Plan(int /*moe_layer*/,
                                                   const std::vector<int>& expert_offsets) {
  if (absl::Status status = CheckExpertOffsets(expert_offsets, num_experts_); !status.ok()) {
    return status;
  }
  return ExchangePlan{.local_offsets = expert_offsets};
}

}  // namespace tandem::engine
