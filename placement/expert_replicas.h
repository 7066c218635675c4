#ifndef TANDEM_PLACEMENT_EXPERT_REPLICAS_H_
#define TANDEM_PLACEMENT_EXPERT_REPLICAS_H_

#include "absl/status/status.h"
#include "common/communicator.h"
#include "engine/parameters.h"
#include "placement/expert_placement.h"

// A step's replicas of hot experts (ExpertPlacement::replicas, per MoE layer) in the parameters of
// an expert-parallel rank: taken from their owners before the step's passes, their gradients given
// back to the owners after. Collectives over the placement's expert-parallel group.
namespace tandem::placement {

// `parameters` hold this rank's own experts of `placements` in every MoE layer; afterwards each
// layer's stacked tensors also hold the rank's replicas of that layer after them
// (ExpertPlacement::Computed): their values copied from their owners, their gradients (where
// enabled) zero. Tensors may move in memory: rebind what points into them (an optimizer) once the
// replicas are released.
absl::Status HoldReplicas(Communicator& group, const LayerPlacements& placements,
                          engine::ParameterSet& parameters);

// The inverse, after the passes: each replica's gradients (where enabled) added to its owner's,
// and the replicas dropped, so `parameters` hold the rank's own experts again.
absl::Status ReleaseReplicas(Communicator& group, const LayerPlacements& placements,
                             engine::ParameterSet& parameters);

// After a failure between the two (or within either): drops whatever replicas `parameters`
// still hold on this rank alone, no collective and no gradients given back, so they hold rank
// `rank`'s own experts of `placements` again.
void DropReplicas(const LayerPlacements& placements, int rank, engine::ParameterSet& parameters);

}  // namespace tandem::placement

#endif  // TANDEM_PLACEMENT_EXPERT_REPLICAS_H_
