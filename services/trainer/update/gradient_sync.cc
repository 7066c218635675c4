#include "services/trainer/update/gradient_sync.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "common/communicator.h"

namespace tandem::trainer {
namespace {

// Sums the gradients of `params` over `ranks` (nothing to do without, or on one rank).
absl::Status SumGradientsOver(Communicator* ranks, std::span<const engine::Param> params) {
  if (ranks == nullptr || ranks->size() == 1 || params.empty()) return absl::OkStatus();
  // One collective for all of them: a LoRA has a tensor per target per expert per layer.
  std::vector<float> packed;
  for (const engine::Param& param : params) {
    packed.insert(packed.end(), param.grad, param.grad + param.size);
  }
  if (absl::Status status = ranks->AllReduceSum(packed.data(), static_cast<int64_t>(packed.size()));
      !status.ok()) {
    return status;
  }
  const float* next = packed.data();
  for (const engine::Param& param : params) {
    std::copy(next, next + param.size, param.grad);
    next += param.size;
  }
  return absl::OkStatus();
}

}  // namespace

GradientSync::GradientSync(RankGroups groups, std::function<bool(const engine::Param&)> per_expert)
    : groups_(groups), per_expert_(std::move(per_expert)) {}

absl::Status GradientSync::SumAcrossRanks(absl::Span<double> values) const {
  Communicator* ranks = groups_.data_parallel;
  if (ranks == nullptr || ranks->size() == 1) return absl::OkStatus();
  // Communicators sum floats: counts stay exact below 2^24, sums keep float's 7 digits.
  std::vector<float> buffer(values.begin(), values.end());
  if (absl::Status status = ranks->AllReduceSum(buffer.data(), static_cast<int64_t>(buffer.size()));
      !status.ok()) {
    return status;
  }
  std::copy(buffer.begin(), buffer.end(), values.begin());
  return absl::OkStatus();
}

GradientSync::SplitParams GradientSync::Split(std::span<const engine::Param> params) const {
  SplitParams split;
  for (const engine::Param& param : params) {
    (per_expert_(param) ? split.per_expert : split.shared).push_back(param);
  }
  return split;
}

absl::Status GradientSync::SumGradients(std::span<const engine::Param> params) const {
  if (!expert_parallel()) return SumGradientsOver(groups_.data_parallel, params);
  const SplitParams split = Split(params);
  if (absl::Status status = SumGradientsOver(groups_.data_parallel, split.shared); !status.ok()) {
    return status;
  }
  return SumGradientsOver(groups_.same_experts, split.per_expert);
}

absl::StatusOr<double> GradientSync::GlobalGradNorm(std::span<const engine::Param> params) const {
  if (!expert_parallel()) return std::sqrt(engine::SquaredGradNorm(params));
  const SplitParams split = Split(params);
  // Each rank of the group holds other experts: their squares add up over the group, sent as
  // a float and its remainder so the double survives the float collective.
  const double mine = engine::SquaredGradNorm(split.per_expert);
  const float parts[] = {static_cast<float>(mine),
                         static_cast<float>(mine - static_cast<float>(mine))};
  absl::StatusOr<std::vector<float>> all = GatherFromRanks(*groups_.expert_group, parts);
  if (!all.ok()) return all.status();
  double expert_squares = 0;
  for (float part : *all) expert_squares += part;
  return std::sqrt(engine::SquaredGradNorm(split.shared) + expert_squares);
}

absl::StatusOr<int> GradientSync::MostInExpertGroup(int mine) const {
  if (!expert_parallel()) return mine;
  const float value = static_cast<float>(mine);
  absl::StatusOr<std::vector<float>> all =
      GatherFromRanks(*groups_.expert_group, absl::MakeConstSpan(&value, 1));
  if (!all.ok()) return all.status();
  return static_cast<int>(*std::max_element(all->begin(), all->end()));
}

}  // namespace tandem::trainer
