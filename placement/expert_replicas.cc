#include "placement/expert_replicas.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "placement/expert_moves.h"

namespace tandem::placement {
namespace {

// Where `expert` sits among `held`.
int64_t IndexOf(const std::vector<int>& held, int expert) {
  return std::find(held.begin(), held.end(), expert) - held.begin();
}

// Floats each rank sends to (or receives from) every other: `expert_size` per expert listed.
struct Traffic {
  std::vector<float> send;
  std::vector<int64_t> send_counts, receive_counts;
};

// rows: this rank's own experts' and then its replicas' gradients -> its own experts' only, each
// with every replica's of it added.
absl::Status AddToOwners(Communicator& group, const ExpertPlacement& placement, int64_t expert_size,
                         std::vector<float>& rows) {
  const int ranks = group.size(), me = group.rank();
  const std::vector<int> owners = placement.Owners();
  const std::vector<int>& own = placement.experts[me];
  const std::vector<int>& mine = placement.replicas[me];
  Traffic traffic{.send_counts = std::vector<int64_t>(ranks, 0),
                  .receive_counts = std::vector<int64_t>(ranks, 0)};
  // Each rank sends its replicas' gradients to their owners, ordered by owner (AllToAllV sends
  // one run per rank), each owner's in mine's order.
  for (int owner = 0; owner < ranks; ++owner) {
    for (size_t i = 0; i < mine.size(); ++i) {
      if (owners[mine[i]] != owner) continue;
      const auto from = rows.begin() + (own.size() + i) * expert_size;
      traffic.send.insert(traffic.send.end(), from, from + expert_size);
      traffic.send_counts[owner] += expert_size;
    }
  }
  for (int source = 0; source < ranks; ++source) {
    for (int expert : placement.replicas[source]) {
      if (owners[expert] == me) traffic.receive_counts[source] += expert_size;
    }
  }
  std::vector<float> received(
      std::accumulate(traffic.receive_counts.begin(), traffic.receive_counts.end(), int64_t{0}));
  if (absl::Status status = group.AllToAllV(traffic.send.data(), traffic.send_counts,
                                            received.data(), traffic.receive_counts);
      !status.ok()) {
    return status;
  }
  int64_t at = 0;  // Received by source, each source's in its replica list's order.
  for (int source = 0; source < ranks; ++source) {
    for (int expert : placement.replicas[source]) {
      if (owners[expert] != me) continue;
      float* into = rows.data() + IndexOf(own, expert) * expert_size;
      for (int64_t j = 0; j < expert_size; ++j) into[j] += received[at + j];
      at += expert_size;
    }
  }
  rows.resize(own.size() * expert_size);
  return absl::OkStatus();
}

// Every stacked tensor of `parameters` cut to its first `own` experts (values and gradients).
void KeepOwn(const LayerPlacements& placements, int rank, engine::ParameterSet& parameters) {
  for (const std::string& name : parameters.names()) {
    engine::Parameter& parameter = *parameters.Find(name);
    if (!parameter.stacked_experts || parameter.shape[0] == 0) continue;
    const std::vector<int>& own = placements.layers[parameter.moe_layer].experts[rank];
    const int64_t count = static_cast<int64_t>(own.size());
    const int64_t expert_size = parameter.expert_size();
    parameter.value.resize(count * expert_size);
    if (!parameter.grad.empty()) parameter.grad.resize(count * expert_size);
    parameter.shape[0] = count;
    parameter.experts = own;
  }
}

// A layer's placement lists replicas for each of its ranks, or none.
absl::Status CheckReplicaLists(const LayerPlacements& placements) {
  for (size_t layer = 0; layer < placements.layers.size(); ++layer) {
    const ExpertPlacement& placement = placements.layers[layer];
    if (!placement.replicas.empty() && placement.replicas.size() != placement.experts.size()) {
      return absl::InvalidArgumentError(absl::StrCat("MoE layer ", layer, ": replicas for ",
                                                     placement.replicas.size(), " ranks of ",
                                                     placement.ranks()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status HoldReplicas(Communicator& group, const LayerPlacements& placements,
                          engine::ParameterSet& parameters) {
  const int me = group.rank();
  if (absl::Status status = CheckReplicaLists(placements); !status.ok()) return status;
  if (absl::Status status = CheckHeldExperts(placements, me, parameters, /*with_replicas=*/false);
      !status.ok()) {
    return status;
  }
  for (const std::string& name : parameters.names()) {
    engine::Parameter& parameter = *parameters.Find(name);
    if (!parameter.stacked_experts) continue;
    const ExpertPlacement& placement = placements.layers[parameter.moe_layer];
    if (!placement.has_replicas()) continue;
    // Each rank's experts and replicas, taken from their owners as a move would.
    ExpertPlacement held;
    for (int rank = 0; rank < placement.ranks(); ++rank) {
      held.experts.push_back(placement.Computed(rank));
    }
    if (absl::Status status = MoveExpertRows(group, placement.Owned(), held,
                                             parameter.expert_size(), parameter.value);
        !status.ok()) {
      return status;
    }
    if (!parameter.grad.empty()) parameter.grad.resize(parameter.value.size(), 0.0f);
    parameter.shape[0] = static_cast<int64_t>(held.experts[me].size());
    parameter.experts = held.experts[me];
  }
  return absl::OkStatus();
}

absl::Status ReleaseReplicas(Communicator& group, const LayerPlacements& placements,
                             engine::ParameterSet& parameters) {
  const int me = group.rank();
  if (absl::Status status = CheckReplicaLists(placements); !status.ok()) return status;
  if (absl::Status status = CheckHeldExperts(placements, me, parameters, /*with_replicas=*/true);
      !status.ok()) {
    return status;
  }
  for (const std::string& name : parameters.names()) {
    engine::Parameter& parameter = *parameters.Find(name);
    if (!parameter.stacked_experts || parameter.grad.empty()) continue;
    const ExpertPlacement& placement = placements.layers[parameter.moe_layer];
    if (!placement.has_replicas()) continue;
    if (absl::Status status =
            AddToOwners(group, placement, parameter.expert_size(), parameter.grad);
        !status.ok()) {
      return status;
    }
  }
  KeepOwn(placements, me, parameters);
  return absl::OkStatus();
}

void DropReplicas(const LayerPlacements& placements, int rank, engine::ParameterSet& parameters) {
  KeepOwn(placements, rank, parameters);
}

}  // namespace tandem::placement
