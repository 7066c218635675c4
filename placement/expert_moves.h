#ifndef TANDEM_PLACEMENT_EXPERT_MOVES_H_
#define TANDEM_PLACEMENT_EXPERT_MOVES_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/communicator.h"
#include "engine/parameters.h"
#include "placement/expert_placement.h"

// A change of expert placement between steps: every rank of an expert-parallel group sends the
// experts it holds under `from` to the ranks holding them under `to`, over the group (one
// all-to-all per tensor). Collective over `group`, whose size is both placements' ranks; host
// memory (a Gloo group).
namespace tandem::placement {

// `rows`: this rank's experts under `from` (`expert_size` floats each, in from's order) in place
// <- its experts under `to`, in to's order, as many as `to` gives it (each from its holder under
// `from`; `to` may give an expert to several ranks, as replicas).
absl::Status MoveExpertRows(Communicator& group, const ExpertPlacement& from,
                            const ExpertPlacement& to, int64_t expert_size,
                            std::vector<float>& rows);

// Every stacked tensor of `parameters` (values, and gradients when enabled), each of which must
// hold this rank's experts of its MoE layer under `from`, moved to hold them under `to`; tensors
// not stacked by expert stay. The tensors keep their memory (an optimizer's pointers into it stay
// valid).
absl::Status MoveExperts(Communicator& group, const LayerPlacements& from,
                         const LayerPlacements& to, engine::ParameterSet& parameters);

// FAILED_PRECONDITION unless every stacked tensor of `parameters` holds rank `rank`'s experts of
// its MoE layer under `placements` (with their replicas when `with_replicas`).
absl::Status CheckHeldExperts(const LayerPlacements& placements, int rank,
                              const engine::ParameterSet& parameters, bool with_replicas);

}  // namespace tandem::placement

#endif  // TANDEM_PLACEMENT_EXPERT_MOVES_H_
