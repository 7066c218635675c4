#ifndef TANDEM_ENGINE_EXPERT_PLACEMENT_H_
#define TANDEM_ENGINE_EXPERT_PLACEMENT_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace tandem::engine {

// Which global experts each rank of an expert-parallel group computes, and in which order it
// holds them (its stacked tensors' order): rank r computes experts[r]. Every expert is on exactly
// one rank and every rank holds as many. The same placement serves every MoE layer.
struct ExpertPlacement {
  std::vector<std::vector<int>> experts;

  // Rank r holds experts [r·E/ranks, (r+1)·E/ranks): the default.
  static ExpertPlacement Contiguous(int num_experts, int ranks);

  int ranks() const { return static_cast<int>(experts.size()); }
  // Each expert's slot: its place when every rank's experts follow each other in rank order
  // (rank r's are slots [r·E/ranks, (r+1)·E/ranks)).
  std::vector<int16_t> Slots() const;
  // Each expert's rank.
  std::vector<int> Owners() const;
  bool operator==(const ExpertPlacement& other) const = default;
};

// INVALID_ARGUMENT unless `placement` puts each of `num_experts` experts on one of `ranks` ranks
// exactly once, as many on each.
absl::Status ValidatePlacement(const ExpertPlacement& placement, int num_experts, int ranks);

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_EXPERT_PLACEMENT_H_
