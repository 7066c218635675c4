#include "placement/expert_rebalance.h"

#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "common/gloo_communicator.h"
#include "engine/cpu_model_ops.h"
#include "engine/expert_parallel_exchange.h"
#include "engine/testing/test_models.h"
#include "engine/transformer.h"
#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"

namespace tandem::placement {
namespace {

// One job of `ranks` expert-parallel ranks (1 × ranks: the job's ranks are the group's), each
// holding its contiguous experts of the tiny model with an adapter and its optimizer, as a job
// does before its first step.
void OnExpertRanks(
    int ranks,
    const std::function<void(int, Communicator&, engine::ExpertParallelExchange&,
                             engine::BaseModel&, engine::LoraAdapter&, engine::AdamW&)>& body) {
  const engine::ModelConfig config = engine::test_models::TinyConfig();
  const engine::BaseModel whole = engine::test_models::RandomModel(config, 1);
  const engine::LoraAdapter whole_lora =
      *engine::LoraAdapter::Create(config, engine::test_models::TestLora(config), 2);
  gloo::rendezvous::HashStore store;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      auto group = GlooCommunicator::Create(store, rank, ranks, {});
      ASSERT_TRUE(group.ok()) << group.status();
      auto exchange = engine::ExpertParallelExchange::Create(**group, config.num_experts,
                                                             config.num_moe_layers());
      ASSERT_TRUE(exchange.ok()) << exchange.status();
      const std::vector<int> own = (*exchange)->local_experts(0)->experts;
      engine::BaseModel base = *whole.ExpertShard(own);
      engine::LoraAdapter lora = *whole_lora.ExpertShard(own);
      lora.parameters().EnableGradients();
      engine::AdamW optimizer =
          *engine::AdamW::Create({}, engine::OptimizerParams(lora.parameters()));
      body(rank, **group, **exchange, base, lora, optimizer);
      EXPECT_TRUE((*group)->Barrier().ok());
    });
  }
  for (std::thread& thread : threads) thread.join();
}

// `tokens` tokens of one rank routed, in MoE layer l, to the top_k experts hot[l] names.
std::vector<int16_t> Routes(const engine::ModelConfig& config, int tokens,
                            const std::vector<std::vector<int16_t>>& hot) {
  std::vector<int16_t> routes;
  for (int t = 0; t < tokens; ++t) {
    for (int layer = 0; layer < config.num_moe_layers(); ++layer) {
      routes.insert(routes.end(), hot[layer].begin(), hot[layer].end());
    }
  }
  return routes;
}

// The first MoE layer routes every token to experts 0 and 1, which rank 0 holds; the second to
// experts 2 and 3, which rank 1 holds. Summed over the layers the ranks are even, so one plan for
// every layer sees nothing to do; each layer on its own is 2.0 (one rank does all its work). Each
// layer is balanced on its own load, its experts moved and counted, and a second step over the
// same load keeps the placements.
TEST(ExpertRebalanceTest, EachMoeLayerIsBalancedOnItsOwnLoad) {
  OnExpertRanks(2, [](int rank, Communicator& group, engine::ExpertParallelExchange& exchange,
                      engine::BaseModel& base, engine::LoraAdapter& lora,
                      engine::AdamW& optimizer) {
    const engine::ModelConfig& config = base.config();
    ASSERT_EQ(config.num_moe_layers(), 2);
    ASSERT_EQ(config.top_k, 2);
    const std::vector<int16_t> routes = Routes(config, 50, {{0, 1}, {2, 3}});
    absl::StatusOr<Rebalanced> first =
        RebalanceExperts(group, group, exchange, routes, {}, base, lora, optimizer);
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_DOUBLE_EQ(first->before.mean, 2.0);
    EXPECT_DOUBLE_EQ(first->before.worst, 2.0);
    EXPECT_LT(first->after.worst, 1.1) << "rank " << rank;
    EXPECT_GT(first->experts_moved, 0);
    EXPECT_GT(first->bytes_moved, 0);
    // Each layer took its own placement: its hot experts on different ranks.
    const LayerPlacements& placements = exchange.placements();
    for (int layer = 0; layer < 2; ++layer) {
      const std::vector<int> owners = placements.layers[layer].Owners();
      EXPECT_NE(owners[2 * layer], owners[2 * layer + 1]) << "MoE layer " << layer;
    }
    // The model and adapter follow: every stacked tensor holds its layer's experts of this rank.
    for (const engine::ParameterSet* parameters : {&base.parameters(), &lora.parameters()}) {
      for (const std::string& name : parameters->names()) {
        const engine::Parameter& parameter = *parameters->Find(name);
        if (!parameter.stacked_experts) continue;
        EXPECT_EQ(parameter.experts, placements.layers[parameter.moe_layer].experts[rank]) << name;
      }
    }

    absl::StatusOr<Rebalanced> second =
        RebalanceExperts(group, group, exchange, routes, {}, base, lora, optimizer);
    ASSERT_TRUE(second.ok()) << second.status();
    EXPECT_EQ(second->experts_moved, 0);
    EXPECT_LT(second->before.worst, 1.1);
  });
}

// Loads that are even in every layer leave the placements, and the bytes moved, alone.
TEST(ExpertRebalanceTest, EvenLoadsMoveNothing) {
  OnExpertRanks(2,
                [](int, Communicator& group, engine::ExpertParallelExchange& exchange,
                   engine::BaseModel& base, engine::LoraAdapter& lora, engine::AdamW& optimizer) {
                  const LayerPlacements start = exchange.placements();
                  const std::vector<int16_t> routes = Routes(base.config(), 40, {{0, 2}, {1, 3}});
                  absl::StatusOr<Rebalanced> rebalanced =
                      RebalanceExperts(group, group, exchange, routes, {}, base, lora, optimizer);
                  ASSERT_TRUE(rebalanced.ok()) << rebalanced.status();
                  EXPECT_DOUBLE_EQ(rebalanced->before.worst, 1.0);
                  EXPECT_EQ(rebalanced->experts_moved, 0);
                  EXPECT_EQ(rebalanced->replicas_made, 0);
                  EXPECT_EQ(rebalanced->bytes_moved, 0);
                  EXPECT_EQ(exchange.placements(), start);
                });
}

// The same skewed load, priced by measured costs: over a link of 1 KB/s no move or replica pays
// for itself (the placements stay, 2.0 per layer); over 100 GB/s they do, and the layers even.
// Rank 1's costs differ from rank 0's: every rank plans with rank 0's, so the group agrees.
TEST(ExpertRebalanceTest, MovesAndReplicasAreMadeOnlyWhenTheyPayForThemselves) {
  for (const double link : {1e3, 1e11}) {
    OnExpertRanks(
        2, [link](int rank, Communicator& group, engine::ExpertParallelExchange& exchange,
                  engine::BaseModel& base, engine::LoraAdapter& lora, engine::AdamW& optimizer) {
          const LayerPlacements start = exchange.placements();
          const std::vector<int16_t> routes = Routes(base.config(), 50, {{0, 1}, {2, 3}});
          const BalanceCosts costs{.link_bytes_per_second = rank == 0 ? link : 1e15,
                                   .seconds_per_row = 1e-6,
                                   .passes_per_step = 3,
                                   .replica_passes_per_step = 2,
                                   .replica_holds_per_step = 2};
          absl::StatusOr<Rebalanced> rebalanced =
              RebalanceExperts(group, group, exchange, routes, costs, base, lora, optimizer);
          ASSERT_TRUE(rebalanced.ok()) << rebalanced.status();
          if (link < 1e6) {
            EXPECT_EQ(rebalanced->experts_moved, 0);
            EXPECT_EQ(rebalanced->replicas_made, 0);
            EXPECT_EQ(rebalanced->bytes_moved, 0);
            EXPECT_DOUBLE_EQ(rebalanced->after.worst, 2.0);
            EXPECT_EQ(exchange.placements(), start);
          } else {
            EXPECT_GT(rebalanced->experts_moved, 0);
            EXPECT_LT(rebalanced->after.worst, 1.1);
          }
        });
  }
}

// Routes a model takes: each rank's tokens through the whole tiny model (no expert parallelism),
// as rollout records them for replay.
std::vector<int16_t> RecordedRoutes(const engine::BaseModel& whole, int rank) {
  engine::BaseModel model = whole;
  engine::Transformer transformer(model, nullptr,
                                  std::make_unique<engine::CpuModelOps>(model.config()));
  std::mt19937 rng(300 + rank);
  engine::TokenBatch batch;
  for (int s = 0; s < 24; ++s) {
    std::vector<int> sequence(12);
    for (int& token : sequence) token = static_cast<int>(rng() % model.config().vocab_size);
    batch.Add(sequence);
  }
  EXPECT_TRUE(transformer.Forward(batch).ok());
  return transformer.routes();
}

// On routes a model recorded, balancing never leaves a layer worse than the static placement it
// starts from: per layer, the mean and the worst after are at most before.
TEST(ExpertRebalanceTest, RecordedRoutesEndNoWorseThanStaticInAnyLayer) {
  const engine::BaseModel whole =
      engine::test_models::RandomModel(engine::test_models::TinyConfig(), 1);
  OnExpertRanks(2, [&whole](int rank, Communicator& group, engine::ExpertParallelExchange& exchange,
                            engine::BaseModel& base, engine::LoraAdapter& lora,
                            engine::AdamW& optimizer) {
    const std::vector<int16_t> routes = RecordedRoutes(whole, rank);
    absl::StatusOr<Rebalanced> rebalanced =
        RebalanceExperts(group, group, exchange, routes, {}, base, lora, optimizer);
    ASSERT_TRUE(rebalanced.ok()) << rebalanced.status();
    std::printf("rank %d: recorded routes, per-layer imbalance %.3f -> %.3f (worst %.3f -> %.3f)\n",
                rank, rebalanced->before.mean, rebalanced->after.mean, rebalanced->before.worst,
                rebalanced->after.worst);
    EXPECT_GT(rebalanced->before.worst, 1.0);  // Static is uneven on these routes.
    EXPECT_LE(rebalanced->after.mean, rebalanced->before.mean);
    EXPECT_LE(rebalanced->after.worst, rebalanced->before.worst);
  });
}

}  // namespace
}  // namespace tandem::placement
