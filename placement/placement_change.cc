#include "placement/placement_change.h"

#include <string>
#include <vector>

#include "placement/expert_moves.h"

namespace tandem::placement {

absl::Status ChangePlacement(Communicator& group, engine::ExpertParallelExchange& exchange,
                             const LayerPlacements& to, engine::BaseModel& base,
                             engine::LoraAdapter& lora, engine::AdamW& optimizer) {
  const LayerPlacements from = exchange.placements();
  if (absl::Status status = ValidatePlacements(to, base.config().num_experts, group.size(),
                                               static_cast<int>(from.layers.size()));
      !status.ok()) {
    return status;
  }
  // The moments first, while the adapter still says where its experts are.
  engine::AdamWState state = optimizer.ExportState();
  const engine::ParameterSet& held = lora.parameters();
  for (const std::string& name : held.names()) {
    const engine::Parameter& parameter = *held.Find(name);
    if (!parameter.stacked_experts) continue;
    for (const char* moment : {".exp_avg", ".exp_avg_sq"}) {
      if (absl::Status status = MoveExpertRows(
              group, from.layers[parameter.moe_layer], to.layers[parameter.moe_layer],
              parameter.expert_size(), state.tensors.at(name + moment));
          !status.ok()) {
        return status;
      }
    }
  }
  for (engine::ParameterSet* parameters : {&base.parameters(), &lora.parameters()}) {
    if (absl::Status status = MoveExperts(group, from, to, *parameters); !status.ok()) {
      return status;
    }
  }
  if (absl::Status status = optimizer.ImportState(state); !status.ok()) return status;
  return exchange.SetPlacements(to);
}

}  // namespace tandem::placement
