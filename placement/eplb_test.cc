#include "placement/eplb.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::placement {
namespace {

using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::Pointwise;

// The example of EPLB's README: 2 layers, 12 experts in 4 groups, 16 slots on 2 nodes x 4 GPUs.
PlacementRequest ReferenceRequest() {
  return {.num_layers = 2,
          .num_experts = 12,
          .load = {90, 132, 40,  61, 104, 165, 39,  4,   73,  56, 183, 86,  //
                   20, 107, 104, 64, 19,  197, 187, 157, 172, 86, 16,  27},
          .num_replicas = 16,
          .num_groups = 4,
          .num_nodes = 2,
          .num_gpus = 8};
}

std::vector<int32_t> Row(const std::vector<int32_t>& v, int row, int width) {
  return std::vector<int32_t>(v.begin() + row * width, v.begin() + (row + 1) * width);
}

// Checks that `plan` is a well-formed placement for `request`: every slot holds one expert,
// every expert has at least one replica, and logcnt, log2phy and gpu_loads agree with phy2log.
void ExpectValidPlan(const PlacementRequest& request, const PlacementPlan& plan) {
  const int layers = request.num_layers;
  const int experts = request.num_experts;
  const int replicas = request.num_replicas;
  const int gpus = request.num_gpus;
  ASSERT_EQ(plan.num_layers, layers);
  ASSERT_EQ(plan.num_experts, experts);
  ASSERT_EQ(plan.num_replicas, replicas);
  ASSERT_EQ(plan.phy2log.size(), static_cast<size_t>(layers) * replicas);
  ASSERT_EQ(plan.logcnt.size(), static_cast<size_t>(layers) * experts);
  ASSERT_EQ(plan.log2phy.size(), static_cast<size_t>(layers) * experts * plan.max_replicas);
  ASSERT_EQ(plan.gpu_loads.size(), static_cast<size_t>(layers) * gpus);
  ASSERT_EQ(plan.balancedness_before.size(), static_cast<size_t>(layers));
  ASSERT_EQ(plan.balancedness_after.size(), static_cast<size_t>(layers));
  int max_count = 0;
  for (int l = 0; l < layers; ++l) {
    std::vector<int> count(experts, 0);
    for (int p = 0; p < replicas; ++p) {
      const int e = plan.phy2log[l * replicas + p];
      ASSERT_GE(e, 0);
      ASSERT_LT(e, experts);
      ++count[e];
    }
    int sum = 0;
    std::vector<int> seen(replicas, 0);
    for (int e = 0; e < experts; ++e) {
      const int logcnt = plan.logcnt[l * experts + e];
      EXPECT_GE(logcnt, 1) << "layer " << l << " expert " << e;
      EXPECT_EQ(logcnt, count[e]) << "layer " << l << " expert " << e;
      sum += logcnt;
      max_count = std::max(max_count, logcnt);
      for (int r = 0; r < plan.max_replicas; ++r) {
        const int p = plan.log2phy[(l * experts + e) * plan.max_replicas + r];
        if (r >= logcnt) {
          EXPECT_EQ(p, -1) << "layer " << l << " expert " << e << " replica " << r;
          continue;
        }
        ASSERT_GE(p, 0);
        ASSERT_LT(p, replicas);
        EXPECT_EQ(plan.phy2log[l * replicas + p], e);
        ++seen[p];
      }
    }
    EXPECT_EQ(sum, replicas) << "layer " << l;
    EXPECT_THAT(seen, ::testing::Each(1)) << "layer " << l;

    double total = 0;
    for (int e = 0; e < experts; ++e) total += request.load[l * experts + e];
    double gpu_total = 0;
    for (int g = 0; g < gpus; ++g) gpu_total += plan.gpu_loads[l * gpus + g];
    EXPECT_NEAR(gpu_total, total, 1e-9 * std::max(1.0, total)) << "layer " << l;
    EXPECT_GT(plan.balancedness_after[l], 0.0);
    EXPECT_LE(plan.balancedness_after[l], 1.0 + 1e-12);
  }
  EXPECT_EQ(plan.max_replicas, max_count);
}

// In the hierarchical policy a group of experts stays on one node, replicas included.
void ExpectGroupsStayOnOneNode(const PlacementRequest& request, const PlacementPlan& plan) {
  const int group_size = request.num_experts / request.num_groups;
  const int slots_per_node = request.num_replicas / request.num_nodes;
  for (int l = 0; l < request.num_layers; ++l) {
    std::vector<int> node_of_group(request.num_groups, -1);
    for (int p = 0; p < request.num_replicas; ++p) {
      const int group = plan.phy2log[l * request.num_replicas + p] / group_size;
      const int node = p / slots_per_node;
      if (node_of_group[group] == -1) node_of_group[group] = node;
      EXPECT_EQ(node_of_group[group], node) << "layer " << l << " slot " << p;
    }
  }
}

PlacementRequest RandomRequest(int layers, int experts, int replicas, int groups, int nodes,
                               int gpus, uint32_t seed) {
  PlacementRequest request{.num_layers = layers,
                           .num_experts = experts,
                           .load = {},
                           .num_replicas = replicas,
                           .num_groups = groups,
                           .num_nodes = nodes,
                           .num_gpus = gpus};
  std::mt19937 rng(seed);
  std::exponential_distribution<double> load(1.0 / 1000);
  request.load.resize(static_cast<size_t>(layers) * experts);
  for (double& v : request.load) v = std::floor(load(rng));
  return request;
}

TEST(PlanPlacementTest, MatchesEplbReferenceExample) {
  const PlacementRequest request = ReferenceRequest();
  absl::StatusOr<PlacementPlan> plan = PlanPlacement(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectValidPlan(request, *plan);
  ExpectGroupsStayOnOneNode(request, *plan);

  EXPECT_THAT(Row(plan->phy2log, 0, 16),
              ElementsAre(5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1));
  EXPECT_THAT(Row(plan->phy2log, 1, 16),
              ElementsAre(7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1));
  EXPECT_THAT(Row(plan->logcnt, 0, 12), ElementsAre(1, 2, 1, 1, 2, 2, 1, 1, 1, 1, 2, 1));
  EXPECT_THAT(Row(plan->logcnt, 1, 12), ElementsAre(1, 2, 1, 1, 1, 2, 2, 1, 2, 1, 1, 1));
  EXPECT_EQ(plan->max_replicas, 2);
  // log2phy lists replicas by rank, not by slot: expert 1's original (rank 0) went to slot 15,
  // its copy to slot 13.
  EXPECT_THAT(Row(plan->log2phy, 1, 2), ElementsAre(15, 13));
  EXPECT_THAT(Row(plan->log2phy, 5, 2), ElementsAre(0, 2));

  const std::vector<double> want_loads = {121.5, 86.5, 125, 113, 147.5, 131.5, 156, 152};
  EXPECT_THAT(std::vector<double>(plan->gpu_loads.begin(), plan->gpu_loads.begin() + 8),
              Pointwise(DoubleNear(1e-9), want_loads));
  EXPECT_NEAR(plan->balancedness_after[0], 0.828, 1e-3);
  EXPECT_NEAR(plan->balancedness_after[1], 0.805, 1e-3);
  EXPECT_LT(plan->balancedness_before[0], plan->balancedness_after[0]);
}

TEST(PlanPlacementTest, FallsBackToGlobalPolicyWhenGroupsDoNotSplitOverNodes) {
  PlacementRequest request = ReferenceRequest();
  request.num_groups = 3;  // 3 % 2 != 0
  request.num_gpus = 4;
  absl::StatusOr<PlacementPlan> plan = PlanPlacement(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectValidPlan(request, *plan);

  // The fallback is exactly the policy with a single group on a single node.
  PlacementRequest global = request;
  global.num_groups = 1;
  global.num_nodes = 1;
  absl::StatusOr<PlacementPlan> global_plan = PlanPlacement(global);
  ASSERT_TRUE(global_plan.ok()) << global_plan.status();
  EXPECT_EQ(plan->phy2log, global_plan->phy2log);
  EXPECT_EQ(plan->log2phy, global_plan->log2phy);
  EXPECT_EQ(plan->logcnt, global_plan->logcnt);
}

TEST(PlanPlacementTest, ReplicationImprovesSkewedLoad) {
  PlacementRequest request{.num_layers = 1,
                           .num_experts = 8,
                           .load = {1000, 10, 20, 30, 40, 50, 60, 70},
                           .num_replicas = 16,
                           .num_groups = 1,
                           .num_nodes = 1,
                           .num_gpus = 4};
  absl::StatusOr<PlacementPlan> plan = PlanPlacement(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectValidPlan(request, *plan);
  EXPECT_GE(plan->balancedness_after[0], plan->balancedness_before[0]);
  EXPECT_GT(plan->balancedness_after[0], 0.9);
  EXPECT_GE(plan->logcnt[0], 4);  // the hot expert is spread over several slots
}

TEST(PlanPlacementTest, AllZeroLoadIsPerfectlyBalanced) {
  PlacementRequest request = ReferenceRequest();
  std::fill(request.load.begin(), request.load.end(), 0.0);
  absl::StatusOr<PlacementPlan> plan = PlanPlacement(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectValidPlan(request, *plan);
  EXPECT_THAT(plan->balancedness_before, ElementsAre(1.0, 1.0));
  EXPECT_THAT(plan->balancedness_after, ElementsAre(1.0, 1.0));
}

TEST(PlanPlacementTest, DeepSeekV3Shape) {
  const PlacementRequest request = RandomRequest(61, 256, 288, 8, 4, 32, 1);
  absl::StatusOr<PlacementPlan> plan = PlanPlacement(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectValidPlan(request, *plan);
  ExpectGroupsStayOnOneNode(request, *plan);
  for (int l = 0; l < request.num_layers; ++l) {
    EXPECT_GE(plan->balancedness_after[l], plan->balancedness_before[l]) << "layer " << l;
  }
}

TEST(PlanPlacementTest, SixHundredExpertsHierarchical) {
  const PlacementRequest request = RandomRequest(4, 600, 640, 8, 4, 32, 2);
  absl::StatusOr<PlacementPlan> plan = PlanPlacement(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectValidPlan(request, *plan);
  ExpectGroupsStayOnOneNode(request, *plan);
}

TEST(PlanPlacementTest, SixHundredExpertsGlobal) {
  const PlacementRequest request = RandomRequest(4, 600, 608, 6, 4, 32, 3);  // 6 % 4 != 0
  absl::StatusOr<PlacementPlan> plan = PlanPlacement(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectValidPlan(request, *plan);
}

TEST(PlanPlacementTest, RejectsPlanWithOversizedLog2Phy) {
  // One hot expert takes every redundant slot: log2phy would be 32767 x 32768 entries.
  PlacementRequest request{.num_layers = 1,
                           .num_experts = 32767,
                           .load = std::vector<double>(32767, 0.0),
                           .num_replicas = 65534,
                           .num_groups = 1,
                           .num_nodes = 1,
                           .num_gpus = 1};
  request.load[0] = 1;
  absl::StatusOr<PlacementPlan> plan = PlanPlacement(request);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(), HasSubstr("max_replicas"));
}

struct BadRequest {
  std::string name;
  std::function<void(PlacementRequest&)> mutate;
  std::string field;  // must appear in the error message
};

class PlanPlacementValidationTest : public ::testing::TestWithParam<BadRequest> {};

TEST_P(PlanPlacementValidationTest, ReturnsInvalidArgumentNamingTheField) {
  PlacementRequest request = ReferenceRequest();
  GetParam().mutate(request);
  absl::StatusOr<PlacementPlan> plan = PlanPlacement(request);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << plan.status();
  EXPECT_THAT(plan.status().message(), HasSubstr(GetParam().field));
}

// Sets num_layers or num_experts and resizes load to match, so only that field is bad.
void Resize(PlacementRequest& r, int layers, int experts) {
  r.num_layers = layers;
  r.num_experts = experts;
  r.load.assign(static_cast<size_t>(std::max(layers, 0)) * std::max(experts, 0), 1.0);
}

INSTANTIATE_TEST_SUITE_P(
    BadInputs, PlanPlacementValidationTest,
    ::testing::Values(
        BadRequest{"ZeroLayers", [](auto& r) { Resize(r, 0, 12); }, "num_layers"},
        BadRequest{"TooManyLayers", [](auto& r) { Resize(r, 1025, 12); }, "num_layers"},
        BadRequest{"ZeroExperts", [](auto& r) { Resize(r, 2, 0); }, "num_experts"},
        BadRequest{"TooManyExperts", [](auto& r) { Resize(r, 1, 32768); }, "num_experts"},
        BadRequest{"LoadTooShort", [](auto& r) { r.load.pop_back(); }, "load has 23 values"},
        BadRequest{"LoadTooLong", [](auto& r) { r.load.push_back(1); }, "load has 25 values"},
        BadRequest{"NegativeLoad", [](auto& r) { r.load[13] = -1; }, "load[1][1]"},
        BadRequest{"NanLoad", [](auto& r) { r.load[2] = std::numeric_limits<double>::quiet_NaN(); },
                   "load[0][2]"},
        BadRequest{"InfiniteLoad",
                   [](auto& r) { r.load[3] = std::numeric_limits<double>::infinity(); },
                   "load[0][3]"},
        BadRequest{"LoadBeyondFloat32", [](auto& r) { r.load[4] = 1e300; }, "load[0][4]"},
        BadRequest{"ZeroGpus", [](auto& r) { r.num_gpus = 0; }, "num_gpus"},
        BadRequest{"ZeroNodes", [](auto& r) { r.num_nodes = 0; }, "num_nodes"},
        BadRequest{"NegativeGroups", [](auto& r) { r.num_groups = -4; }, "num_groups"},
        BadRequest{"FewerReplicasThanExperts", [](auto& r) { r.num_replicas = 8; }, "num_replicas"},
        BadRequest{"TooManyReplicas", [](auto& r) { r.num_replicas = kMaxReplicas + 8; },
                   "num_replicas"},
        BadRequest{"ReplicasNotMultipleOfGpus", [](auto& r) { r.num_replicas = 20; },
                   "num_replicas (20) must be a multiple of num_gpus (8)"},
        BadRequest{"GpusNotMultipleOfNodes", [](auto& r) { r.num_nodes = 3; },
                   "num_gpus (8) must be a multiple of num_nodes (3)"},
        BadRequest{"ExpertsNotMultipleOfGroups", [](auto& r) { r.num_groups = 5; },
                   "num_experts (12) must be a multiple of num_groups (5)"},
        // 8 KB of request that once allocated ~2 GB of plan before any limit applied.
        BadRequest{"TooManySlotsInAll",
                   [](auto& r) {
                     Resize(r, 1024, 1);
                     r.num_replicas = 65536;
                     r.num_gpus = 65536;
                     r.num_nodes = 1;
                     r.num_groups = 1;
                   },
                   "num_layers * num_replicas = 67108864"}),
    [](const ::testing::TestParamInfo<BadRequest>& info) { return info.param.name; });

}  // namespace
}  // namespace tandem::placement
