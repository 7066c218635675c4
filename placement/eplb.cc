#include "placement/eplb.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status.h"

namespace tandem::placement {
namespace {

// EPLB runs on `weight.float()`, so every load, sum and quotient it compares is a float32. We
// compute the same way so that equal-in-float32 loads tie exactly as they do there.
using Row = std::vector<float>;

// The inverse of a permutation: inv[perm[i]] = i.
std::vector<int> Inverse(const std::vector<int>& perm) {
  std::vector<int> inv(perm.size());
  for (int i = 0; i < static_cast<int>(perm.size()); ++i) inv[perm[i]] = i;
  return inv;
}

// Item indices by descending weight, as `weight.sort(-1, descending=True).indices`. Equal
// weights keep index order. torch leaves the order of ties unspecified (stable=False) and it
// varies by build: its generic CPU kernel, std::sort, keeps index order up to 16 items (it is
// an insertion sort there), while longer rows and x86-simd-sort builds may permute ties. Index
// order is the one portable choice, and it matches torch wherever torch's order is stable.
std::vector<int> SortDescending(const Row& weight) {
  std::vector<int> order(weight.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return weight[a] > weight[b]; });
  return order;
}

struct Packing {
  std::vector<int> pack_index;    // pack of each item
  std::vector<int> rank_in_pack;  // position of each item in its pack
};

// balanced_packing for one row: items, heaviest first, go to the lightest pack that still has
// room, each pack taking exactly n / num_packs items.
Packing BalancedPacking(const Row& weight, int num_packs) {
  const int n = static_cast<int>(weight.size());
  const int per_pack = n / num_packs;
  Packing packing{std::vector<int>(n), std::vector<int>(n, 0)};
  if (per_pack == 1) {  // EPLB's shortcut: item i to pack i, not by weight.
    std::iota(packing.pack_index.begin(), packing.pack_index.end(), 0);
    return packing;
  }
  // Open packs ordered by (weight, index): begin() is what Python's min() over the open packs
  // in index order returns, the first of the lightest. Pack weights add up in float32.
  std::set<std::pair<float, int>> open;
  for (int p = 0; p < num_packs; ++p) open.emplace(0.0f, p);
  std::vector<int> items(num_packs, 0);
  for (int item : SortDescending(weight)) {
    auto [pack_weight, pack] = *open.begin();
    open.erase(open.begin());
    packing.pack_index[item] = pack;
    packing.rank_in_pack[item] = items[pack]++;
    if (items[pack] < per_pack) open.emplace(pack_weight + weight[item], pack);
  }
  return packing;
}

struct Replication {
  std::vector<int> phy2log;  // logical expert of each physical expert
  std::vector<int> rank;     // replica rank of each physical expert
  std::vector<int> logcnt;   // replicas of each logical expert
};

// replicate_experts for one row: physical expert i < num_log is logical i; each further one
// replicates the expert with the largest load per replica, the lowest index among equals (what
// `.max(dim=-1).indices` returns). A set keyed like that argmax replaces the O(num_log) scan.
Replication ReplicateExperts(const Row& weight, int num_phy) {
  const int num_log = static_cast<int>(weight.size());
  Replication rep{std::vector<int>(num_phy), std::vector<int>(num_phy, 0),
                  std::vector<int>(num_log, 1)};
  std::iota(rep.phy2log.begin(), rep.phy2log.begin() + num_log, 0);
  // (-load per replica, expert): begin() is the argmax. Negating a float is exact.
  std::set<std::pair<float, int>> queue;
  for (int e = 0; e < num_log; ++e) queue.emplace(-weight[e], e);
  for (int i = num_log; i < num_phy; ++i) {
    const int e = queue.begin()->second;
    queue.erase(queue.begin());
    rep.phy2log[i] = e;
    rep.rank[i] = rep.logcnt[e]++;
    // weight / logcnt in float32, as torch divides a float tensor by an int64 one.
    queue.emplace(-(weight[e] / static_cast<float>(rep.logcnt[e])), e);
  }
  return rep;
}

struct Shape {
  int num_experts, num_replicas, num_groups, num_nodes, num_gpus;
};

struct LayerPlan {
  std::vector<int> phy2log;  // [R]
  std::vector<int> phyrank;  // [R]
  std::vector<int> logcnt;   // [E]
};

// Step 1 of rebalance_experts_hierarchical: packs expert groups onto nodes and returns log2mlog,
// the position of each logical expert in the node-major ("middle logical") order.
std::vector<int> PackGroupsToNodes(const Row& weight, const Shape& s) {
  const int group_size = s.num_experts / s.num_groups;
  const int groups_per_node = s.num_groups / s.num_nodes;
  Row tokens_per_group(s.num_groups);
  for (int g = 0; g < s.num_groups; ++g) {
    // Summed in double and rounded once; torch's vectorized float32 sum may differ in the last
    // bit for non-integral loads (integral loads below 2^24 are exact either way).
    double sum = 0;
    for (int j = 0; j < group_size; ++j) sum += weight[g * group_size + j];
    tokens_per_group[g] = static_cast<float>(sum);
  }
  const Packing packing = BalancedPacking(tokens_per_group, s.num_nodes);
  std::vector<int> log2mlog(s.num_experts);
  for (int g = 0; g < s.num_groups; ++g) {
    const int base =
        (packing.pack_index[g] * groups_per_node + packing.rank_in_pack[g]) * group_size;
    for (int j = 0; j < group_size; ++j) log2mlog[g * group_size + j] = base + j;
  }
  return log2mlog;
}

// Steps 2 and 3 for one node. `node_weight` holds the node's experts in mlog order. Writes the
// node's physical slots in GPU order, as pphy2mlog (mlog ids local to the node) and pphyrank,
// and the replica count of each of the node's experts into mlogcnt.
void PlanNode(const Row& node_weight, const Shape& s, int* pphy2mlog, int* pphyrank, int* mlogcnt) {
  const int phy_per_node = s.num_replicas / s.num_nodes;
  const int phy_per_gpu = s.num_replicas / s.num_gpus;
  const Replication rep = ReplicateExperts(node_weight, phy_per_node);
  // Each replica carries an equal float32 share of its expert's load.
  Row tokens_per_phy(phy_per_node);
  for (int k = 0; k < phy_per_node; ++k) {
    const int m = rep.phy2log[k];
    tokens_per_phy[k] = node_weight[m] / static_cast<float>(rep.logcnt[m]);
  }
  const Packing packing = BalancedPacking(tokens_per_phy, s.num_gpus / s.num_nodes);
  std::vector<int> phy2pphy(phy_per_node);
  for (int k = 0; k < phy_per_node; ++k) {
    phy2pphy[k] = packing.pack_index[k] * phy_per_gpu + packing.rank_in_pack[k];
  }
  const std::vector<int> pphy2phy = Inverse(phy2pphy);
  for (int pp = 0; pp < phy_per_node; ++pp) {
    pphy2mlog[pp] = rep.phy2log[pphy2phy[pp]];
    pphyrank[pp] = rep.rank[pphy2phy[pp]];
  }
  std::copy(rep.logcnt.begin(), rep.logcnt.end(), mlogcnt);
}

// rebalance_experts_hierarchical for one layer (EPLB's tensor ops treat layers independently).
LayerPlan RebalanceLayer(const Row& weight, const Shape& s) {
  const std::vector<int> log2mlog = PackGroupsToNodes(weight, s);
  const std::vector<int> mlog2log = Inverse(log2mlog);
  const int log_per_node = s.num_experts / s.num_nodes;
  const int phy_per_node = s.num_replicas / s.num_nodes;
  LayerPlan plan{std::vector<int>(s.num_replicas), std::vector<int>(s.num_replicas),
                 std::vector<int>(s.num_experts)};
  std::vector<int> pphy2mlog(s.num_replicas);
  std::vector<int> mlogcnt(s.num_experts);
  for (int n = 0; n < s.num_nodes; ++n) {
    Row node_weight(log_per_node);
    for (int k = 0; k < log_per_node; ++k) {
      node_weight[k] = weight[mlog2log[n * log_per_node + k]];
    }
    PlanNode(node_weight, s, &pphy2mlog[n * phy_per_node], &plan.phyrank[n * phy_per_node],
             &mlogcnt[n * log_per_node]);
  }
  for (int p = 0; p < s.num_replicas; ++p) {
    const int node = p / phy_per_node;
    plan.phy2log[p] = mlog2log[pphy2mlog[p] + node * log_per_node];
  }
  for (int e = 0; e < s.num_experts; ++e) plan.logcnt[e] = mlogcnt[log2mlog[e]];
  return plan;
}

// INVALID_ARGUMENT about the PlanPlacementRequest field at `field` (a LoadMatrix's fields are
// under "load": the request's only way to set num_layers, num_experts and the loads).
template <typename... Args>
absl::Status Invalid(absl::string_view field, const Args&... args) {
  return InvalidField(field, absl::StrCat(args...));
}

absl::Status ValidateLoads(const PlacementRequest& r) {
  const int64_t want = int64_t{r.num_layers} * r.num_experts;
  if (static_cast<int64_t>(r.load.size()) != want) {
    return Invalid("load.load", "load has ", r.load.size(),
                   " values, want num_layers * num_experts = ", want);
  }
  for (int64_t i = 0; i < want; ++i) {
    const double v = r.load[i];
    const int64_t layer = i / r.num_experts;
    const int64_t expert = i % r.num_experts;
    if (!std::isfinite(v) || v < 0) {
      return Invalid(IndexPath("load.load", i), "load[", layer, "][", expert, "] is ", v,
                     "; loads must be finite and >= 0");
    }
    // EPLB computes in float32; a larger load would become infinite there.
    if (v > std::numeric_limits<float>::max()) {
      return Invalid(IndexPath("load.load", i), "load[", layer, "][", expert, "] is ", v,
                     ", beyond the float32 range");
    }
  }
  return absl::OkStatus();
}

// Every shape EPLB accepts. The hierarchical policy's own asserts (groups_per_node integral,
// num_physical_experts // num_nodes >= num_experts // num_nodes, replicas per node divisible by
// GPUs per node) follow from these whenever num_groups % num_nodes == 0, and the global policy
// with one group and one node asserts nothing more.
absl::Status ValidateRequest(const PlacementRequest& r) {
  if (r.num_layers < 1 || r.num_layers > 1024) {
    return Invalid("load.num_layers", "num_layers must be in [1, 1024], got ", r.num_layers);
  }
  if (r.num_experts < 1 || r.num_experts > 32767) {
    return Invalid("load.num_experts", "num_experts must be in [1, 32767], got ", r.num_experts);
  }
  if (absl::Status status = ValidateLoads(r); !status.ok()) return status;
  if (r.num_gpus < 1) return Invalid("num_gpus", "num_gpus must be >= 1, got ", r.num_gpus);
  if (r.num_nodes < 1) return Invalid("num_nodes", "num_nodes must be >= 1, got ", r.num_nodes);
  if (r.num_groups < 1) {
    return Invalid("num_groups", "num_groups must be >= 1, got ", r.num_groups);
  }
  if (r.num_replicas < r.num_experts) {
    return Invalid("num_replicas", "num_replicas (", r.num_replicas, ") must be >= num_experts (",
                   r.num_experts, ")");
  }
  if (r.num_replicas > kMaxReplicas) {
    return Invalid("num_replicas", "num_replicas must be <= ", kMaxReplicas, ", got ",
                   r.num_replicas);
  }
  if (r.num_replicas % r.num_gpus != 0) {
    return Invalid("num_replicas", "num_replicas (", r.num_replicas,
                   ") must be a multiple of num_gpus (", r.num_gpus, ")");
  }
  // The proto states each divisibility rule on the divisor's field.
  if (r.num_gpus % r.num_nodes != 0) {
    return Invalid("num_nodes", "num_gpus (", r.num_gpus, ") must be a multiple of num_nodes (",
                   r.num_nodes, ")");
  }
  if (r.num_experts % r.num_groups != 0) {
    return Invalid("num_groups", "num_experts (", r.num_experts,
                   ") must be a multiple of num_groups (", r.num_groups, ")");
  }
  // num_gpus divides num_replicas, so [L, G] is never larger than [L, R].
  if (const int64_t slots = int64_t{r.num_layers} * r.num_replicas; slots > kMaxPlanEntries) {
    return Invalid("num_replicas", "phy2log would hold num_layers * num_replicas = ", slots,
                   " entries, over ", kMaxPlanEntries, "; lower num_replicas or num_layers");
  }
  return absl::OkStatus();
}

// mean / max of per-GPU loads; 1.0 (perfect) when every GPU is idle.
double Balancedness(const double* gpu_loads, int num_gpus) {
  double sum = 0;
  double max = 0;
  for (int g = 0; g < num_gpus; ++g) {
    sum += gpu_loads[g];
    max = std::max(max, gpu_loads[g]);
  }
  return max == 0 ? 1.0 : sum / num_gpus / max;
}

// Fills gpu_loads and both balancedness vectors, in double from the request's loads.
void ComputeBalance(const PlacementRequest& r, PlacementPlan& plan) {
  const int e_count = r.num_experts;
  const int gpus = r.num_gpus;
  const int slots_per_gpu = r.num_replicas / gpus;
  plan.gpu_loads.assign(static_cast<size_t>(r.num_layers) * gpus, 0.0);
  plan.balancedness_before.resize(r.num_layers);
  plan.balancedness_after.resize(r.num_layers);
  std::vector<double> before(gpus);
  for (int l = 0; l < r.num_layers; ++l) {
    const double* load = &r.load[static_cast<size_t>(l) * e_count];
    std::fill(before.begin(), before.end(), 0.0);
    for (int e = 0; e < e_count; ++e) before[int64_t{e} * gpus / e_count] += load[e];
    plan.balancedness_before[l] = Balancedness(before.data(), gpus);

    double* after = &plan.gpu_loads[static_cast<size_t>(l) * gpus];
    const int32_t* phy2log = &plan.phy2log[static_cast<size_t>(l) * r.num_replicas];
    const int32_t* logcnt = &plan.logcnt[static_cast<size_t>(l) * e_count];
    for (int p = 0; p < r.num_replicas; ++p) {
      after[p / slots_per_gpu] += load[phy2log[p]] / logcnt[phy2log[p]];
    }
    plan.balancedness_after[l] = Balancedness(after, gpus);
  }
}

// log2phy[l, e, rank] = p for every slot p holding replica `rank` of expert e, as EPLB's
// scatter_ of arange(R) at phy2log * max_replicas + phyrank.
void FillLog2Phy(const std::vector<int32_t>& phyrank, PlacementPlan& plan) {
  const int rows = plan.num_experts * plan.max_replicas;
  plan.log2phy.assign(static_cast<size_t>(plan.num_layers) * rows, -1);
  for (int l = 0; l < plan.num_layers; ++l) {
    for (int p = 0; p < plan.num_replicas; ++p) {
      const size_t slot = static_cast<size_t>(l) * plan.num_replicas + p;
      plan.log2phy[static_cast<size_t>(l) * rows + plan.phy2log[slot] * plan.max_replicas +
                   phyrank[slot]] = p;
    }
  }
}

}  // namespace

absl::StatusOr<PlacementPlan> PlanPlacement(const PlacementRequest& request) {
  if (absl::Status status = ValidateRequest(request); !status.ok()) return status;
  Shape shape{request.num_experts, request.num_replicas, request.num_groups, request.num_nodes,
              request.num_gpus};
  if (shape.num_groups % shape.num_nodes != 0) {
    // EPLB's global policy: the hierarchical one with a single group on a single node.
    shape.num_groups = 1;
    shape.num_nodes = 1;
  }
  const int layers = request.num_layers;
  const int experts = request.num_experts;
  const int replicas = request.num_replicas;
  PlacementPlan plan;
  plan.num_layers = layers;
  plan.num_experts = experts;
  plan.num_replicas = replicas;
  plan.phy2log.resize(static_cast<size_t>(layers) * replicas);
  plan.logcnt.resize(static_cast<size_t>(layers) * experts);
  std::vector<int32_t> phyrank(plan.phy2log.size());
  Row weight(experts);
  for (int l = 0; l < layers; ++l) {
    for (int e = 0; e < experts; ++e) {
      weight[e] = static_cast<float>(request.load[static_cast<size_t>(l) * experts + e]);
    }
    const LayerPlan layer = RebalanceLayer(weight, shape);
    std::copy(layer.phy2log.begin(), layer.phy2log.end(), &plan.phy2log[l * replicas]);
    std::copy(layer.phyrank.begin(), layer.phyrank.end(), &phyrank[l * replicas]);
    std::copy(layer.logcnt.begin(), layer.logcnt.end(), &plan.logcnt[l * experts]);
  }
  plan.max_replicas = *std::max_element(plan.logcnt.begin(), plan.logcnt.end());
  const int64_t log2phy_entries = int64_t{layers} * experts * plan.max_replicas;
  if (log2phy_entries > kMaxPlanEntries) {
    return Invalid(
        "num_replicas", "plan needs max_replicas = ", plan.max_replicas,
        ", so log2phy would hold num_layers * num_experts * max_replicas = ", log2phy_entries,
        " entries, over ", kMaxPlanEntries, "; lower num_replicas or num_layers");
  }
  FillLog2Phy(phyrank, plan);
  ComputeBalance(request, plan);
  return plan;
}

}  // namespace tandem::placement
