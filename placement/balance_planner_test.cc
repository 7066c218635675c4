#include "placement/balance_planner.h"

#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::placement {
namespace {

StepLoad RandomSkewedLoad(int micro_batches, int experts, uint64_t seed) {
  std::mt19937_64 rng(seed);
  StepLoad load{.micro_batches = micro_batches, .experts = experts};
  for (int m = 0; m < micro_batches; ++m) {
    for (int e = 0; e < experts; ++e) {
      // A few hot experts, different in every micro-batch.
      const bool hot = (e + m) % 7 == 0;
      load.tokens.push_back(static_cast<int64_t>(rng() % 50) + (hot ? 800 : 0));
    }
  }
  return load;
}

// Every rank holds experts / ranks homes; every expert's tokens are served in full; replicas only
// on ranks of the home's node and within each rank's slots.
void ExpectValidPlan(const StepLoad& load, const EpTopology& topology, const BalancePlan& plan) {
  std::vector<int> held(topology.ranks, 0);
  for (const int rank : plan.home) ++held[rank];
  EXPECT_THAT(held, ::testing::Each(load.experts / topology.ranks));
  ASSERT_EQ(plan.micro_batches.size(), static_cast<size_t>(load.micro_batches));
  for (int m = 0; m < load.micro_batches; ++m) {
    const MicroBatchPlan& batch = plan.micro_batches[m];
    std::map<int, int64_t> served;
    std::vector<int> replicas(topology.ranks, 0);
    for (const ExpertCopy& copy : batch.copies) {
      served[copy.expert] += copy.tokens;
      EXPECT_EQ(copy.rank / topology.ranks_per_node,
                plan.home[copy.expert] / topology.ranks_per_node)
          << "replicas stay in the home's node";
      replicas[copy.rank] += copy.rank != plan.home[copy.expert];
    }
    EXPECT_THAT(replicas, ::testing::Each(::testing::Le(topology.replica_slots_per_rank)));
    for (const auto& [expert, tokens] : served) EXPECT_EQ(tokens, load.at(m, expert));
    const std::vector<int64_t> before = HomeRankTokens(load, m, plan.home, topology.ranks);
    EXPECT_EQ(std::accumulate(batch.rank_tokens.begin(), batch.rank_tokens.end(), int64_t{0}),
              std::accumulate(before.begin(), before.end(), int64_t{0}));
    EXPECT_LE(MaxOverMean(batch.rank_tokens), MaxOverMean(before) + 1e-12);
  }
}

TEST(ExpertBalanceTest, ReorderingAndReplicationBalanceASkewedStep) {
  const StepLoad load = RandomSkewedLoad(8, 64, 1);
  const EpTopology topology{.ranks = 8, .ranks_per_node = 4, .replica_slots_per_rank = 2};
  const std::vector<int> contiguous = ContiguousHomes(64, 8);
  absl::StatusOr<BalancePlan> plan = PlanBalance(load, topology, contiguous);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectValidPlan(load, topology, *plan);
  // Mean over micro-batches of max/mean tokens per rank: reordering beats the static placement
  // and replication beats reordering alone (cross-node differences within a micro-batch stay:
  // replicas never leave their node).
  double static_mean = 0, reordered_mean = 0, planned_mean = 0;
  for (int m = 0; m < load.micro_batches; ++m) {
    static_mean += MaxOverMean(HomeRankTokens(load, m, contiguous, 8)) / load.micro_batches;
    reordered_mean += MaxOverMean(HomeRankTokens(load, m, plan->home, 8)) / load.micro_batches;
    planned_mean += MaxOverMean(plan->micro_batches[m].rank_tokens) / load.micro_batches;
  }
  EXPECT_LT(reordered_mean, static_mean);
  EXPECT_LT(planned_mean, reordered_mean);
  EXPECT_GT(plan->experts_moved, 0);
}

TEST(ExpertBalanceTest, AnExpertStaysWhereMovingItWouldCostMoreThanItGains) {
  StepLoad even{.micro_batches = 2, .experts = 8};
  even.tokens.assign(16, 100);
  const EpTopology topology{.ranks = 4, .ranks_per_node = 2, .replica_slots_per_rank = 2};
  const std::vector<int> current = {3, 3, 2, 2, 1, 1, 0, 0};
  absl::StatusOr<BalancePlan> plan =
      PlanBalance(even, topology, current, {.move_cost_tokens = 1e9});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->home, current);
  EXPECT_EQ(plan->experts_moved, 0);
  for (const MicroBatchPlan& batch : plan->micro_batches) {
    EXPECT_TRUE(batch.copies.empty()) << "an even load needs no replicas";
    EXPECT_EQ(MaxOverMean(batch.rank_tokens), 1.0);
  }
}

TEST(ExpertBalanceTest, AHotExpertIsSplitAcrossItsNodeWithinTheSlots) {
  StepLoad load{.micro_batches = 1, .experts = 8};
  load.tokens = {1000, 10, 10, 10, 10, 10, 10, 10};
  const EpTopology topology{.ranks = 4, .ranks_per_node = 2, .replica_slots_per_rank = 1};
  absl::StatusOr<BalancePlan> plan = PlanBalance(load, topology, ContiguousHomes(8, 4));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectValidPlan(load, topology, *plan);
  // Expert 0 is served by its home and one replica in the same node, about half each.
  int copies_of_hot = 0;
  for (const ExpertCopy& copy : plan->micro_batches[0].copies) {
    if (copy.expert == 0) {
      ++copies_of_hot;
      EXPECT_GT(copy.tokens, 400);
    }
  }
  EXPECT_EQ(copies_of_hot, 2);
}

// A replica is made only when the tokens it takes off the hot rank pay for its copy: expert 0's
// split (about 500 tokens) pays for a copy priced at 400 tokens, not for one priced at 600.
TEST(ExpertBalanceTest, AReplicaIsMadeOnlyWhenItPaysForItsCopy) {
  StepLoad load{.micro_batches = 1, .experts = 8};
  load.tokens = {1000, 10, 10, 10, 10, 10, 10, 10};
  const EpTopology topology{.ranks = 4, .ranks_per_node = 2, .replica_slots_per_rank = 1};
  for (const auto& [cost, copies] : {std::pair(400.0, 2), std::pair(600.0, 0)}) {
    absl::StatusOr<BalancePlan> plan =
        PlanBalance(load, topology, ContiguousHomes(8, 4),
                    {.move_cost_tokens = 1e9, .replica_cost_tokens = cost});
    ASSERT_TRUE(plan.ok()) << plan.status();
    ExpectValidPlan(load, topology, *plan);
    int copies_of_hot = 0;
    for (const ExpertCopy& copy : plan->micro_batches[0].copies) copies_of_hot += copy.expert == 0;
    EXPECT_EQ(copies_of_hot, copies) << "a copy priced at " << cost << " tokens";
  }
}

// Every rank plans alike: between hot experts equal in every respect the lower id is replicated,
// whatever order a hash map iterates in.
TEST(ExpertBalanceTest, TiesBetweenExpertsGoToTheLowerId) {
  StepLoad load{.micro_batches = 1, .experts = 4};
  load.tokens = {500, 500, 0, 0};
  const EpTopology topology{.ranks = 2, .ranks_per_node = 2, .replica_slots_per_rank = 1};
  absl::StatusOr<BalancePlan> plan =
      PlanBalance(load, topology, {0, 0, 1, 1}, {.move_cost_tokens = 1e9});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectValidPlan(load, topology, *plan);
  std::vector<int> replicated;
  for (const ExpertCopy& copy : plan->micro_batches[0].copies) {
    if (copy.rank != plan->home[copy.expert]) replicated.push_back(copy.expert);
  }
  EXPECT_EQ(replicated, std::vector<int>{0});
}

TEST(ExpertBalanceTest, BadInputsAreRefusedNamingWhatDoesNotFit) {
  StepLoad load{.micro_batches = 1, .experts = 6};
  load.tokens.assign(6, 1);
  EXPECT_EQ(
      PlanBalance(load, {.ranks = 4, .ranks_per_node = 2}, ContiguousHomes(6, 4)).status().code(),
      absl::StatusCode::kInvalidArgument);
  load.experts = 8;
  load.tokens.assign(8, 1);
  EXPECT_EQ(
      PlanBalance(load, {.ranks = 4, .ranks_per_node = 3}, ContiguousHomes(8, 4)).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanBalance(load, {.ranks = 4, .ranks_per_node = 2}, {0, 0, 0, 1, 1, 2, 2, 3})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  load.tokens[3] = -1;
  EXPECT_EQ(
      PlanBalance(load, {.ranks = 4, .ranks_per_node = 2}, ContiguousHomes(8, 4)).status().code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::placement
