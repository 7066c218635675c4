#ifndef TANDEM_PLACEMENT_PLACEMENT_CHANGE_H_
#define TANDEM_PLACEMENT_PLACEMENT_CHANGE_H_

#include "absl/status/status.h"
#include "common/communicator.h"
#include "engine/expert_parallel_exchange.h"
#include "engine/model.h"
#include "engine/optimizer.h"
#include "placement/expert_placement.h"

namespace tandem::placement {

// Changes an expert-parallel group's placements between steps: in each MoE layer the base
// model's experts, the LoRA's and their AdamW moments move over `group` (the exchange's) from the
// exchange's placement of that layer to the ranks `to` gives them, and the exchange computes with
// `to` from then on. Collective over
// `group`; every rank passes the same `to`. The optimizer keeps pointing at the same tensors.
// Training on gives what it gives without the change, up to float summation order.
absl::Status ChangePlacement(Communicator& group, engine::ExpertParallelExchange& exchange,
                             const LayerPlacements& to, engine::BaseModel& base,
                             engine::LoraAdapter& lora, engine::AdamW& optimizer);

}  // namespace tandem::placement

#endif  // TANDEM_PLACEMENT_PLACEMENT_CHANGE_H_
