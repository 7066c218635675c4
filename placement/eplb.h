#ifndef TANDEM_PLACEMENT_EPLB_H_
#define TANDEM_PLACEMENT_EPLB_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::placement {

// Input of the expert-parallel load balancer: per-layer expert loads and the cluster shape.
struct PlacementRequest {
  int num_layers = 0;
  int num_experts = 0;
  std::vector<double> load;  // [num_layers, num_experts] row-major, each >= 0 and finite
  int num_replicas = 0;      // physical expert slots R
  int num_groups = 0;
  int num_nodes = 0;
  int num_gpus = 0;
};

// Where every physical expert slot goes, in the layout of DeepSeek's EPLB, plus the load
// balance of the plan.
struct PlacementPlan {
  int num_layers = 0;
  int num_experts = 0;
  int num_replicas = 0;
  int max_replicas = 0;          // largest replica count of any expert, over all layers
  std::vector<int32_t> phy2log;  // [L, R]: logical expert held by each physical slot
  // [L, E, max_replicas]: log2phy[l, e, r] is the physical slot of replica r of expert e, -1
  // padded. Replica r is the one EPLB created r-th, so slots are not necessarily ascending.
  std::vector<int32_t> log2phy;
  std::vector<int32_t> logcnt;  // [L, E]: replicas per logical expert
  // [L] mean/max per-GPU load with expert e alone on GPU floor(e*G/E), no replicas.
  std::vector<double> balancedness_before;
  // [L] mean/max per-GPU load of the plan. 1.0 for a layer whose loads are all zero.
  std::vector<double> balancedness_after;
  // [L, G] per-GPU load of the plan: an expert's load is split evenly over its replicas, and
  // physical slot p lives on GPU p / (R / G).
  std::vector<double> gpu_loads;
};

// Largest accepted num_replicas, and the most entries any of a plan's arrays may have
// (phy2log [L, R], gpu_loads [L, G], log2phy [L, E, M]): they bound the memory and time a
// request can cost, which a few bytes of request could otherwise make gigabytes. 2^22 entries
// is about as much as a message of the server's default limit (8 MiB) carries.
inline constexpr int kMaxReplicas = 65536;
inline constexpr int64_t kMaxPlanEntries = int64_t{1} << 22;

// Port of DeepSeek's EPLB `rebalance_experts` (github.com/deepseek-ai/EPLB, eplb.py): the
// hierarchical policy (groups packed to nodes, experts replicated within nodes, replicas packed
// to GPUs) when num_groups % num_nodes == 0, else the same policy with one group and one node.
// Computes in float32 like the reference, so it makes the same choices, tie-breaks included.
// INVALID_ARGUMENT naming the bad field for any input EPLB would reject or assert on; its
// details name the field as PlanPlacementRequest does (num_replicas, load.num_layers,
// load.load[i]), the only way a request reaches it.
absl::StatusOr<PlacementPlan> PlanPlacement(const PlacementRequest& request);

}  // namespace tandem::placement

#endif  // TANDEM_PLACEMENT_EPLB_H_
