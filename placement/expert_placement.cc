#include "placement/expert_placement.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace tandem::placement {

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

bool ExpertPlacement::has_replicas() const {
  for (const std::vector<int>& held : replicas) {
    if (!held.empty()) return true;
  }
  return false;
}

std::vector<int> ExpertPlacement::Computed(int rank) const {
  std::vector<int> computed = experts[rank];
  if (!replicas.empty()) {
    computed.insert(computed.end(), replicas[rank].begin(), replicas[rank].end());
  }
  return computed;
}

std::vector<std::vector<int>> ExpertPlacement::Copies() const {
  const std::vector<int> owners = Owners();
  std::vector<std::vector<int>> copies(owners.size());
  for (size_t expert = 0; expert < owners.size(); ++expert) copies[expert] = {owners[expert]};
  for (int rank = 0; rank < static_cast<int>(replicas.size()); ++rank) {
    for (int expert : replicas[rank]) copies[expert].push_back(rank);
  }
  return copies;
}

ExpertPlacement::RowPiece ExpertPlacement::PieceOf(int expert, int copy, int copies,
                                                   int64_t rows) const {
  const auto given = shares.find(expert);
  int64_t before = copy, through = copy + 1, total = copies;  // Equal shares.
  if (given != shares.end()) {
    const std::vector<int64_t>& share = given->second;
    before = std::accumulate(share.begin(), share.begin() + copy, int64_t{0});
    through = before + share[copy];
    total = std::accumulate(share.begin(), share.end(), int64_t{0});
  }
  const int64_t first = rows * before / total;
  return {.first = first, .count = rows * through / total - first};
}

namespace {

absl::Status ValidateReplicas(const ExpertPlacement& placement, int num_experts) {
  if (placement.replicas.empty()) {
    return placement.shares.empty()
               ? absl::OkStatus()
               : absl::InvalidArgumentError("shares of copies without replicas");
  }
  if (placement.replicas.size() != placement.experts.size()) {
    return absl::InvalidArgumentError(absl::StrCat("replicas for ", placement.replicas.size(),
                                                   " ranks in a placement of ", placement.ranks()));
  }
  for (int rank = 0; rank < placement.ranks(); ++rank) {
    const std::vector<int> computed = placement.Computed(rank);
    for (int expert : placement.replicas[rank]) {
      if (expert < 0 || expert >= num_experts ||
          std::count(computed.begin(), computed.end(), expert) != 1) {
        return absl::InvalidArgumentError(absl::StrCat("replica of expert ", expert, " on rank ",
                                                       rank, ": no expert of ", num_experts,
                                                       ", or one the rank holds already"));
      }
    }
  }
  const std::vector<std::vector<int>> copies = placement.Copies();
  // Rows (< 2^24 per layer) times a total of at most 64 shares of at most 2^32 fit int64 in
  // PieceOf.
  constexpr int64_t kMaxShare = int64_t{1} << 32;
  for (const auto& [expert, share] : placement.shares) {
    const bool in_range =
        std::all_of(share.begin(), share.end(), [](int64_t s) { return s > 0 && s <= kMaxShare; });
    if (expert < 0 || expert >= num_experts || share.size() != copies[expert].size() ||
        share.size() > 64 || !in_range) {
      return absl::InvalidArgumentError(
          absl::StrCat("shares of expert ", expert, ": one share in 1..2^32 per copy (it has ",
                       expert >= 0 && expert < num_experts ? copies[expert].size() : 0, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

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
  return ValidateReplicas(placement, num_experts);
}

LayerPlacements LayerPlacements::Uniform(const ExpertPlacement& placement, int moe_layers) {
  return {.layers = std::vector<ExpertPlacement>(moe_layers, placement)};
}

bool LayerPlacements::has_replicas() const {
  return std::any_of(layers.begin(), layers.end(),
                     [](const ExpertPlacement& layer) { return layer.has_replicas(); });
}

LayerPlacements LayerPlacements::Owned() const {
  LayerPlacements owned;
  for (const ExpertPlacement& layer : layers) owned.layers.push_back(layer.Owned());
  return owned;
}

absl::Status ValidatePlacements(const LayerPlacements& placements, int num_experts, int ranks,
                                int moe_layers) {
  if (static_cast<int>(placements.layers.size()) != moe_layers) {
    return absl::InvalidArgumentError(absl::StrCat("placements of ", placements.layers.size(),
                                                   " MoE layers for a model of ", moe_layers));
  }
  for (int layer = 0; layer < moe_layers; ++layer) {
    if (absl::Status status = ValidatePlacement(placements.layers[layer], num_experts, ranks);
        !status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("MoE layer ", layer, ": ", status.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::placement
