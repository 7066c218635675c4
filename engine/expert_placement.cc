#include "engine/expert_placement.h"

#include <numeric>

#include "absl/strings/str_cat.h"

namespace tandem::engine {

ExpertPlacement ExpertPlacement::Contiguous(int num_experts, int ranks) {
  ExpertPlacement placement;
  const int per_rank = num_experts / ranks;
  for (int rank = 0; rank < ranks; ++rank) {
    std::vector<int>& held = placement.experts.emplace_back(per_rank);
    std::iota(held.begin(), held.end(), rank * per_rank);
  }
  return placement;
}

std::vector<int16_t> ExpertPlacement::Slots() const {
  std::vector<int16_t> slots;
  int16_t slot = 0;
  for (const std::vector<int>& held : experts) {
    for (int expert : held) {
      if (expert >= static_cast<int>(slots.size())) slots.resize(expert + 1, -1);
      slots[expert] = slot++;
    }
  }
  return slots;
}

std::vector<int> ExpertPlacement::Owners() const {
  std::vector<int> owners;
  for (int rank = 0; rank < ranks(); ++rank) {
    for (int expert : experts[rank]) {
      if (expert >= static_cast<int>(owners.size())) owners.resize(expert + 1, -1);
      owners[expert] = rank;
    }
  }
  return owners;
}

absl::Status ValidatePlacement(const ExpertPlacement& placement, int num_experts, int ranks) {
  if (ranks < 1 || num_experts % ranks != 0 || placement.ranks() != ranks) {
    return absl::InvalidArgumentError(absl::StrCat("a placement of ", placement.ranks(),
                                                   " ranks for ", num_experts, " experts on ",
                                                   ranks, " ranks (which must split them evenly)"));
  }
  std::vector<bool> placed(num_experts, false);
  for (int rank = 0; rank < ranks; ++rank) {
    const std::vector<int>& held = placement.experts[rank];
    if (static_cast<int>(held.size()) != num_experts / ranks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, " holds ", held.size(), " experts; each must hold ", num_experts / ranks));
    }
    for (int expert : held) {
      if (expert < 0 || expert >= num_experts || placed[expert]) {
        return absl::InvalidArgumentError(absl::StrCat("expert ", expert, " on rank ", rank,
                                                       " is no expert of ", num_experts,
                                                       " or is placed twice"));
      }
      placed[expert] = true;
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::engine
