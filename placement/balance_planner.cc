#include "placement/balance_planner.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <string>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::placement {
namespace {

// Errors name the PlanBalanceRequest field, as the proto states each rule (ranks divides
// num_experts, ranks_per_node divides ranks).
absl::Status Validate(const StepLoad& load, const EpTopology& topology,
                      const std::vector<int>& current_home) {
  if (topology.ranks < 1 || topology.ranks_per_node < 1 ||
      topology.ranks % topology.ranks_per_node != 0 || topology.replica_slots_per_rank < 0) {
    const char* field = topology.ranks < 1                    ? "ranks"
                        : topology.replica_slots_per_rank < 0 ? "replica_slots_per_rank"
                                                              : "ranks_per_node";
    return InvalidField(
        field, absl::StrCat("topology: ", topology.ranks, " ranks, ", topology.ranks_per_node,
                            " per node, ", topology.replica_slots_per_rank,
                            " replica slots: need ranks_per_node | ranks, "
                            "slots >= 0"));
  }
  if (load.experts < 1 || load.experts % topology.ranks != 0) {
    return InvalidField(load.experts < 1 ? "num_experts" : "ranks",
                        absl::StrCat(load.experts, " experts cannot be spread evenly over ",
                                     topology.ranks, " ranks"));
  }
  const auto negative =
      std::find_if(load.tokens.begin(), load.tokens.end(), [](int64_t t) { return t < 0; });
  if (load.micro_batches < 1 ||
      load.tokens.size() != static_cast<size_t>(load.micro_batches) * load.experts ||
      negative != load.tokens.end()) {
    const std::string field =
        load.micro_batches < 1 ? std::string("micro_batches")
        : load.tokens.size() != static_cast<size_t>(load.micro_batches) * load.experts
            ? std::string("tokens")
            : IndexPath("tokens", negative - load.tokens.begin());
    return InvalidField(
        field, absl::StrCat("load: ", load.tokens.size(), " token counts (each >= 0) for ",
                            load.micro_batches, " micro-batches of ", load.experts, " experts"));
  }
  std::vector<int> held(topology.ranks, 0);
  if (current_home.size() != static_cast<size_t>(load.experts)) {
    return InvalidField("current_home",
                        absl::StrCat("current placement names ", current_home.size(),
                                     " experts of ", load.experts));
  }
  for (size_t e = 0; e < current_home.size(); ++e) {
    const int rank = current_home[e];
    if (rank < 0 || rank >= topology.ranks || ++held[rank] > load.experts / topology.ranks) {
      return InvalidField(
          IndexPath("current_home", static_cast<int64_t>(e)),
          absl::StrCat("current placement: each of ", topology.ranks, " ranks holds ",
                       load.experts / topology.ranks, " experts; rank ", rank, " does not fit"));
    }
  }
  return absl::OkStatus();
}

// Assigns `experts` (ids in descending step load) to `bins` of `capacity` experts each, longest
// first: each to the bin with room whose micro-batch loads its own tokens would add to least
// (the token-weighted mean over micro-batches of the bin's load), so that experts hot in the
// same micro-batches land apart and every micro-batch, not only the step, comes out even. An
// expert stays in its current bin (`current_bin`, -1 for none) while that bin has room and
// costs at most `move_cost` tokens more. Returns the bin of each expert, by position.
std::vector<int> PackLongestFirst(const StepLoad& load, const std::vector<int>& experts, int bins,
                                  int capacity, const std::function<int(int expert)>& current_bin,
                                  double move_cost) {
  const int batches = load.micro_batches;
  std::vector<double> bin_load(static_cast<size_t>(bins) * batches, 0);  // [bin, micro-batch]
  std::vector<int> bin_count(bins, 0);
  std::vector<int> assigned(experts.size());
  for (size_t i = 0; i < experts.size(); ++i) {
    const int expert = experts[i];
    double weight = 0;
    for (int m = 0; m < batches; ++m) weight += static_cast<double>(load.at(m, expert));
    const auto cost = [&](int bin) {
      double weighted = 0;
      for (int m = 0; m < batches; ++m) {
        weighted += static_cast<double>(load.at(m, expert)) * bin_load[bin * batches + m];
      }
      // Without tokens, the bin with the least load over the step.
      if (weight == 0) {
        for (int m = 0; m < batches; ++m) weighted += bin_load[bin * batches + m];
        return weighted;
      }
      return weighted / weight;
    };
    int best = -1;
    double best_cost = 0;
    for (int b = 0; b < bins; ++b) {
      if (bin_count[b] == capacity) continue;
      const double c = cost(b);
      if (best < 0 || c < best_cost) best = b, best_cost = c;
    }
    const int stay = current_bin(expert);
    if (stay >= 0 && bin_count[stay] < capacity && cost(stay) <= best_cost + move_cost) {
      best = stay;
    }
    assigned[i] = best;
    for (int m = 0; m < batches; ++m) {
      bin_load[best * batches + m] += static_cast<double>(load.at(m, expert));
    }
    ++bin_count[best];
  }
  return assigned;
}

// Inter-batch reordering: the step's micro-batches balanced across nodes, then across each
// node's ranks.
std::vector<int> Reorder(const StepLoad& load, const EpTopology& topology,
                         const std::vector<int>& current_home, double move_cost) {
  std::vector<double> step(load.experts, 0);
  for (int m = 0; m < load.micro_batches; ++m) {
    for (int e = 0; e < load.experts; ++e) step[e] += static_cast<double>(load.at(m, e));
  }
  std::vector<int> order(load.experts);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return step[a] > step[b]; });
  const int per_node = topology.ranks_per_node, nodes = topology.ranks / per_node;
  const int per_rank = load.experts / topology.ranks;
  const std::vector<int> node_of_position = PackLongestFirst(
      load, order, nodes, per_rank * per_node, [&](int e) { return current_home[e] / per_node; },
      move_cost);
  std::vector<int> home(load.experts);
  for (int node = 0; node < nodes; ++node) {
    std::vector<int> members;  // Still in descending load.
    for (size_t i = 0; i < order.size(); ++i) {
      if (node_of_position[i] == node) members.push_back(order[i]);
    }
    const std::vector<int> rank_in_node = PackLongestFirst(
        load, members, per_node, per_rank,
        [&](int e) { return current_home[e] / per_node == node ? current_home[e] % per_node : -1; },
        move_cost);
    for (size_t i = 0; i < members.size(); ++i) {
      home[members[i]] = node * per_node + rank_in_node[i];
    }
  }
  return home;
}

// Intra-batch replication of one micro-batch: while the most loaded rank is above another rank
// of its node, half the gap moves to that rank as tokens of one of its experts -- to a copy the
// target holds already, or a new replica in one of the target's free slots. The expert chosen
// moves the most (ties: the one with fewer tokens there, so large ones stay whole).
MicroBatchPlan Replicate(const StepLoad& load, int m, const std::vector<int>& home,
                         const EpTopology& topology, double replica_cost) {
  const int ranks = topology.ranks, per_node = topology.ranks_per_node;
  MicroBatchPlan plan;
  plan.rank_tokens = HomeRankTokens(load, m, home, ranks);
  // What each rank serves: expert -> tokens.
  std::vector<absl::flat_hash_map<int, int64_t>> on(ranks);
  for (int e = 0; e < load.experts; ++e) {
    if (load.at(m, e) > 0) on[home[e]][e] = load.at(m, e);
  }
  std::vector<int> free_slots(ranks, topology.replica_slots_per_rank);
  const int max_moves = ranks * (topology.replica_slots_per_rank + 1) * 4;
  for (int move = 0; move < max_moves; ++move) {
    const int hot =
        static_cast<int>(std::max_element(plan.rank_tokens.begin(), plan.rank_tokens.end()) -
                         plan.rank_tokens.begin());
    const int first = hot / per_node * per_node;
    int best_expert = -1, best_target = -1;
    int64_t best_moved = 0, best_there = 0;
    for (int target = first; target < first + per_node; ++target) {
      const int64_t half_gap = (plan.rank_tokens[hot] - plan.rank_tokens[target]) / 2;
      if (target == hot || half_gap < 1) continue;
      for (const auto& [expert, tokens] : on[hot]) {
        const bool new_copy = !on[target].contains(expert);
        if (new_copy && free_slots[target] == 0) continue;
        const int64_t moved = std::min(tokens, half_gap);
        if (new_copy && static_cast<double>(moved) <= replica_cost) continue;
        // Ties go to the lower expert id: every rank must plan alike, whatever order the map
        // iterates in.
        if (moved > best_moved ||
            (moved == best_moved && moved > 0 &&
             (tokens < best_there || (tokens == best_there && expert < best_expert)))) {
          best_expert = expert, best_target = target, best_moved = moved, best_there = tokens;
        }
      }
    }
    if (best_expert < 0) break;
    if (!on[best_target].contains(best_expert)) --free_slots[best_target];
    on[best_target][best_expert] += best_moved;
    if ((on[hot][best_expert] -= best_moved) == 0) on[hot].erase(best_expert);
    plan.rank_tokens[hot] -= best_moved;
    plan.rank_tokens[best_target] += best_moved;
  }
  // The copies of experts served by more than one rank.
  absl::flat_hash_map<int, int> ranks_serving;
  for (int r = 0; r < ranks; ++r) {
    for (const auto& [expert, tokens] : on[r]) ++ranks_serving[expert];
  }
  for (int r = 0; r < ranks; ++r) {
    for (const auto& [expert, tokens] : on[r]) {
      if (ranks_serving[expert] > 1 || home[expert] != r) {
        plan.copies.push_back({.expert = expert, .rank = r, .tokens = tokens});
      }
    }
  }
  std::sort(plan.copies.begin(), plan.copies.end(), [](const ExpertCopy& a, const ExpertCopy& b) {
    return std::tie(a.expert, a.rank) < std::tie(b.expert, b.rank);
  });
  return plan;
}

}  // namespace

std::vector<int64_t> HomeRankTokens(const StepLoad& load, int micro_batch,
                                    const std::vector<int>& home, int ranks) {
  std::vector<int64_t> rank_tokens(ranks, 0);
  for (int e = 0; e < load.experts; ++e) rank_tokens[home[e]] += load.at(micro_batch, e);
  return rank_tokens;
}

std::vector<int> ContiguousHomes(int experts, int ranks) {
  std::vector<int> home(experts);
  for (int e = 0; e < experts; ++e) {
    home[e] = static_cast<int>(int64_t{e} * ranks / experts);
  }
  return home;
}

absl::StatusOr<BalancePlan> PlanBalance(const StepLoad& load, const EpTopology& topology,
                                        const std::vector<int>& current_home,
                                        const BalanceOptions& options) {
  if (absl::Status status = Validate(load, topology, current_home); !status.ok()) return status;
  BalancePlan plan;
  plan.home = Reorder(load, topology, current_home, options.move_cost_tokens);
  for (int e = 0; e < load.experts; ++e) plan.experts_moved += plan.home[e] != current_home[e];
  for (int m = 0; m < load.micro_batches; ++m) {
    plan.micro_batches.push_back(
        Replicate(load, m, plan.home, topology, options.replica_cost_tokens));
  }
  return plan;
}

}  // namespace tandem::placement
