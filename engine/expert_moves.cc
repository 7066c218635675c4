#include "engine/expert_moves.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem::engine {

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

absl::Status MoveExperts(Communicator& group, const ExpertPlacement& from,
                         const ExpertPlacement& to, ParameterSet& parameters) {
  if (parameters.held_experts() != from.experts[group.rank()]) {
    return absl::FailedPreconditionError(
        "the parameters do not hold this rank's experts of the placement moved from");
  }
  for (const std::string& name : parameters.names()) {
    Parameter& parameter = *parameters.Find(name);
    if (!parameter.stacked_experts) continue;
    const int64_t expert_size = parameter.size() / parameter.shape[0];
    for (std::vector<float>* rows : {&parameter.value, &parameter.grad}) {
      if (rows->empty()) continue;
      if (absl::Status status = MoveExpertRows(group, from, to, expert_size, *rows); !status.ok()) {
        return status;
      }
    }
  }
  parameters.RelabelExperts(to.experts[group.rank()]);
  return absl::OkStatus();
}

}  // namespace tandem::engine
