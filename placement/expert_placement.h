#ifndef TANDEM_PLACEMENT_EXPERT_PLACEMENT_H_
#define TANDEM_PLACEMENT_EXPERT_PLACEMENT_H_

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/status.h"

namespace tandem::placement {

// Which global experts each rank of an expert-parallel group computes, and in which order it
// holds them (its stacked tensors' order): rank r owns experts[r]. Every expert has exactly one
// owner and every rank owns as many. Each MoE layer has a placement of its own (LayerPlacements).
//
// Replicas (ReLibra's intra-step replication) add copies of hot experts for a step: rank r also
// computes replicas[r], experts other ranks own, held after its own. Every rank then splits its
// rows of a replicated expert over the expert's copies -- its owner first, then the replicas in
// rank order -- in proportion to `shares[expert]` (one positive share per copy; equal when the
// expert has none), and each copy's gradients are its rows' share of the expert's.
struct ExpertPlacement {
  std::vector<std::vector<int>> experts;
  std::vector<std::vector<int>> replicas;  // Empty, or one list per rank.
  std::map<int, std::vector<int64_t>> shares;

  // Rank r holds experts [r·E/ranks, (r+1)·E/ranks): the default.
  static ExpertPlacement Contiguous(int num_experts, int ranks);

  int ranks() const { return static_cast<int>(experts.size()); }
  bool has_replicas() const;
  // Each expert's slot: its place when every rank's own experts follow each other in rank order
  // (rank r's are slots [r·E/ranks, (r+1)·E/ranks)).
  std::vector<int16_t> Slots() const;
  // Each expert's owner.
  std::vector<int> Owners() const;
  // The experts rank r computes, in the order it holds them: its own, then its replicas.
  std::vector<int> Computed(int rank) const;
  // Each expert's copies: its owner, then the ranks replicating it, ascending.
  std::vector<std::vector<int>> Copies() const;
  // Rows [first, first + count) of a rank's `rows` rows of `expert` go to copy `copy`.
  struct RowPiece {
    int64_t first = 0;
    int64_t count = 0;
  };
  RowPiece PieceOf(int expert, int copy, int copies, int64_t rows) const;
  // The same owners without replicas.
  ExpertPlacement Owned() const { return {.experts = experts}; }
  bool operator==(const ExpertPlacement& other) const = default;
};

// The placements of every MoE layer of a model on one expert-parallel group, in the model's order
// of MoE layers (engine::ModelConfig::MoeLayerIndices, the routes' layer index): each layer's
// experts go where that layer's load puts them, with that layer's replicas.
struct LayerPlacements {
  std::vector<ExpertPlacement> layers;

  // `placement` on each of `moe_layers` layers.
  static LayerPlacements Uniform(const ExpertPlacement& placement, int moe_layers);

  int ranks() const { return layers.empty() ? 0 : layers.front().ranks(); }
  bool has_replicas() const;
  // The same owners without replicas.
  LayerPlacements Owned() const;
  bool operator==(const LayerPlacements& other) const = default;
};

// INVALID_ARGUMENT unless `placement` puts each of `num_experts` experts on one of `ranks` ranks
// exactly once, as many on each, and each replica on a rank that does not hold it already, with
// one positive share per copy where shares are given.
absl::Status ValidatePlacement(const ExpertPlacement& placement, int num_experts, int ranks);
// INVALID_ARGUMENT unless `placements` has one placement per each of `moe_layers` MoE layers and
// ValidatePlacement accepts each (the message names the layer).
absl::Status ValidatePlacements(const LayerPlacements& placements, int num_experts, int ranks,
                                int moe_layers);

}  // namespace tandem::placement

#endif  // TANDEM_PLACEMENT_EXPERT_PLACEMENT_H_
