#include "placement/expert_moves.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem::placement {

absl::Status MoveExpertRows(Communicator& group, const ExpertPlacement& from,
                            const ExpertPlacement& to, int64_t expert_size,
                            std::vector<float>& rows) {
  const int ranks = group.size(), me = group.rank();
  const std::vector<int>& held = from.experts[me];
  const std::vector<int>& wanted = to.experts[me];
  if (from.ranks() != ranks || to.ranks() != ranks ||
      static_cast<int64_t>(rows.size()) != static_cast<int64_t>(held.size()) * expert_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("moving ", rows.size(), " floats of experts between placements of ",
                     from.ranks(), " and ", to.ranks(), " ranks over ", ranks));
  }
  const std::vector<int> old_owner = from.Owners();
  // Each rank sends the experts it holds to their new owners, in the order each new owner holds
  // them; so a receiver finds, from each source, its own experts that source held, in order.
  std::vector<float> send;
  std::vector<int64_t> send_counts(ranks, 0), receive_counts(ranks, 0);
  for (int destination = 0; destination < ranks; ++destination) {
    for (int expert : to.experts[destination]) {
      if (old_owner[expert] != me) continue;
      const int64_t at = std::find(held.begin(), held.end(), expert) - held.begin();
      send.insert(send.end(), rows.begin() + at * expert_size,
                  rows.begin() + (at + 1) * expert_size);
      send_counts[destination] += expert_size;
    }
  }
  for (int expert : wanted) receive_counts[old_owner[expert]] += expert_size;
  std::vector<float> received(wanted.size() * expert_size);
  if (absl::Status status =
          group.AllToAllV(send.data(), send_counts, received.data(), receive_counts);
      !status.ok()) {
    return status;
  }
  // Received by source, then in wanted's order: put each expert at its place in wanted.
  rows.resize(wanted.size() * expert_size);
  std::vector<int64_t> source_at(ranks, 0);
  for (int source = 1; source < ranks; ++source) {
    source_at[source] = source_at[source - 1] + receive_counts[source - 1];
  }
  for (size_t i = 0; i < wanted.size(); ++i) {
    int64_t& at = source_at[old_owner[wanted[i]]];
    std::copy_n(received.begin() + at, expert_size, rows.begin() + i * expert_size);
    at += expert_size;
  }
  return absl::OkStatus();
}

absl::Status CheckHeldExperts(const LayerPlacements& placements, int rank,
                              const engine::ParameterSet& parameters, bool with_replicas) {
  for (const std::string& name : parameters.names()) {
    const engine::Parameter& parameter = *parameters.Find(name);
    if (!parameter.stacked_experts) continue;
    const int layer = parameter.moe_layer;
    if (layer < 0 || layer >= static_cast<int>(placements.layers.size()) ||
        rank >= placements.layers[layer].ranks()) {
      return absl::InvalidArgumentError(absl::StrCat("'", name, "' is of MoE layer ", layer,
                                                     ", which the placements do not place"));
    }
    const ExpertPlacement& placement = placements.layers[layer];
    const std::vector<int> expected =
        with_replicas ? placement.Computed(rank) : placement.experts[rank];
    if (parameter.experts != expected) {
      return absl::FailedPreconditionError(
          absl::StrCat("'", name, "' does not hold this rank's experts of MoE layer ", layer,
                       with_replicas ? " with their replicas" : " (without replicas)"));
    }
  }
  return absl::OkStatus();
}

absl::Status MoveExperts(Communicator& group, const LayerPlacements& from,
                         const LayerPlacements& to, engine::ParameterSet& parameters) {
  if (absl::Status status = CheckHeldExperts(from, group.rank(), parameters, false); !status.ok()) {
    return status;
  }
  if (to.layers.size() != from.layers.size()) {
    return absl::InvalidArgumentError(absl::StrCat("moving placements of ", from.layers.size(),
                                                   " MoE layers to ", to.layers.size()));
  }
  for (const std::string& name : parameters.names()) {
    engine::Parameter& parameter = *parameters.Find(name);
    if (!parameter.stacked_experts) continue;
    const ExpertPlacement& source = from.layers[parameter.moe_layer];
    const ExpertPlacement& target = to.layers[parameter.moe_layer];
    const int64_t expert_size = parameter.expert_size();
    for (std::vector<float>* rows : {&parameter.value, &parameter.grad}) {
      if (rows->empty()) continue;
      if (absl::Status status = MoveExpertRows(group, source, target, expert_size, *rows);
          !status.ok()) {
        return status;
      }
    }
    parameter.experts = target.experts[group.rank()];
  }
  return absl::OkStatus();
}

}  // namespace tandem::placement
