// Expert parallelism computes what one rank computes. Ranks are Gloo ranks on loopback (threads
// of this process), each with its own tokens and its own copy of the adapter, computing a share
// of the experts: each rank's logits equal one rank's on the same tokens, and the ranks' adapter
// gradients, summed (what data parallelism's all-reduce does), equal one rank's over all tokens.
#include "engine/expert_parallel_exchange.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/gloo_communicator.h"
#include "engine/cpu_model_ops.h"
#include "engine/testing/checked_model_ops.h"
#include "engine/testing/test_models.h"
#include "engine/transformer.h"
#include "gloo/rendezvous/hash_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "placement/expert_moves.h"
#include "placement/expert_replicas.h"

namespace tandem::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Runs `body(rank, group)` on `ranks` Gloo ranks, one thread each. The ranks meet before they
// leave: a rank that tears its group down early can break a peer that is still connecting.
void OnRanks(int ranks, const std::function<void(int, Communicator&)>& body) {
  gloo::rendezvous::HashStore store;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      auto group = GlooCommunicator::Create(store, rank, ranks, {});
      ASSERT_TRUE(group.ok()) << group.status();
      body(rank, **group);
      EXPECT_TRUE((*group)->Barrier().ok());
    });
  }
  for (std::thread& thread : threads) thread.join();
}

// Rank r's tokens: sequences of uneven lengths, different on every rank.
TokenBatch RankBatch(const ModelConfig& config, int rank) {
  std::mt19937_64 rng(100 + rank);
  std::uniform_int_distribution<int> token(0, config.vocab_size - 1);
  TokenBatch batch;
  for (int length : {5 + rank, 3, 8 - rank}) {
    std::vector<int> sequence(length);
    for (int& t : sequence) t = token(rng);
    batch.Add(sequence);
  }
  return batch;
}

std::vector<float> RankDlogits(const ModelConfig& config, const TokenBatch& batch, int rank) {
  std::mt19937_64 rng(200 + rank);
  std::normal_distribution<float> normal;
  std::vector<float> dlogits(static_cast<size_t>(batch.num_tokens()) * config.vocab_size);
  for (float& value : dlogits) value = normal(rng);
  return dlogits;
}

LoraAdapter Adapter(const ModelConfig& config, ExpertLayout layout) {
  LoraConfig lora_config = test_models::TestLora(config);
  lora_config.expert_layout = layout;
  LoraAdapter lora = *LoraAdapter::Create(config, lora_config, 2);
  test_models::RandomizeLora(lora, 3);
  lora.parameters().EnableGradients();
  return lora;
}

// The largest |a - b| / max(1, |a|).
double MaxRelativeDifference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    worst = std::max(worst, std::abs(double{a[i]} - b[i]) / std::max(1.0, std::abs(double{a[i]})));
  }
  return worst;
}

// How a rank holds the experts it does not compute.
enum class Ownership { kReplicated, kSharded };

struct Computed {
  std::vector<std::vector<float>> logits;  // Per rank.
  // Adapter gradients by tensor: summed over ranks, per-expert tensors joined from their owners.
  std::map<std::string, std::vector<float>> gradients;
  std::vector<std::vector<int16_t>> routes;  // Per rank.
  int64_t expert_floats = 0;                 // Base and adapter floats of the experts rank 0 holds.
  std::vector<int64_t> bytes_sent;           // Per rank, by its exchange (expert parallelism only).
  std::vector<int64_t> rows_computed;        // Likewise.
};

// The bytes the all-to-all must carry for `routes` (per rank, [tokens, MoE layers, k] logical
// ids): a row routed to an expert of another rank goes there (dispatch) and its result comes back
// (combine), in the forward and once more, as gradients, in the backward.
// Each route's expert's owner under the placement of the route's MoE layer.
std::vector<int> RouteOwners(const std::vector<int16_t>& routes, const ModelConfig& config,
                             const placement::LayerPlacements& placements) {
  std::vector<std::vector<int>> owners;
  for (const placement::ExpertPlacement& layer : placements.layers)
    owners.push_back(layer.Owners());
  std::vector<int> route_owners;
  for (size_t i = 0; i < routes.size(); ++i) {
    const size_t layer = i / config.top_k % config.num_moe_layers();
    route_owners.push_back(owners[layer][routes[i]]);
  }
  return route_owners;
}

std::vector<int64_t> AnalyticBytes(const std::vector<std::vector<int16_t>>& routes,
                                   const ModelConfig& config,
                                   const placement::LayerPlacements& placements) {
  const int ranks = static_cast<int>(routes.size());
  std::vector<int64_t> rows(ranks, 0);
  for (int rank = 0; rank < ranks; ++rank) {
    for (int owner : RouteOwners(routes[rank], config, placements)) {
      if (owner == rank) continue;
      ++rows[rank];   // Dispatched.
      ++rows[owner];  // Its result, sent back.
    }
  }
  std::vector<int64_t> bytes;
  for (int64_t count : rows) bytes.push_back(2 * count * config.d_model * int64_t{sizeof(float)});
  return bytes;
}

// The rows each rank's experts compute for `routes`: every routed slot of every rank, at its
// expert's owner, in the forward and again in the backward.
std::vector<int64_t> AnalyticRows(const std::vector<std::vector<int16_t>>& routes,
                                  const ModelConfig& config,
                                  const placement::LayerPlacements& placements) {
  std::vector<int64_t> rows(routes.size(), 0);
  for (const std::vector<int16_t>& rank_routes : routes) {
    for (int owner : RouteOwners(rank_routes, config, placements)) rows[owner] += 2;
  }
  return rows;
}

// Floats of every per-expert (stacked) tensor of `parameters`.
int64_t ExpertFloats(const ParameterSet& parameters) {
  int64_t floats = 0;
  for (const std::string& name : parameters.names()) {
    const Parameter& parameter = *parameters.Find(name);
    if (parameter.stacked_experts) floats += parameter.size();
  }
  return floats;
}

// One forward and backward of every rank's batch, with an expert-parallel exchange per rank
// (`ranks` Gloo ranks) or without (nullopt: one rank computing all experts, the batches one
// after the other). Sharded ranks start from the contiguous placement, as a job does, and move
// their experts to `placements` (with their replicas) when given.
Computed Compute(const BaseModel& base, ExpertLayout layout, int ranks,
                 std::optional<Ownership> expert_parallel,
                 std::optional<placement::LayerPlacements> placements = std::nullopt) {
  const ModelConfig& config = base.config();
  Computed computed{.logits = std::vector<std::vector<float>>(ranks),
                    .routes = std::vector<std::vector<int16_t>>(ranks),
                    .bytes_sent = std::vector<int64_t>(ranks, 0),
                    .rows_computed = std::vector<int64_t>(ranks, 0)};
  std::vector<ParameterSet> adapters(ranks);
  auto run = [&](int rank, ExpertExchange* exchange, Communicator* group) {
    BaseModel model = base;
    LoraAdapter lora = Adapter(config, layout);
    if (expert_parallel == Ownership::kSharded) {
      const placement::ExpertPlacement contiguous =
          placement::ExpertPlacement::Contiguous(config.num_experts, ranks);
      model = *base.ExpertShard(contiguous.experts[rank]);
      lora = *lora.ExpertShard(contiguous.experts[rank]);
      if (placements.has_value()) {
        const placement::LayerPlacements start =
            placement::LayerPlacements::Uniform(contiguous, config.num_moe_layers());
        for (ParameterSet* parameters : {&model.parameters(), &lora.parameters()}) {
          ASSERT_TRUE(placement::MoveExperts(*group, start, placements->Owned(), *parameters).ok());
          ASSERT_TRUE(placement::HoldReplicas(*group, *placements, *parameters).ok());
        }
      }
    }
    if (rank == 0) {
      computed.expert_floats = ExpertFloats(model.parameters()) + ExpertFloats(lora.parameters());
    }
    Transformer transformer(model, &lora, std::make_unique<CpuModelOps>(model.config()),
                            Precision::kF32, exchange);
    const TokenBatch batch = RankBatch(config, rank);
    auto logits = transformer.Forward(batch);
    ASSERT_TRUE(logits.ok()) << logits.status();
    computed.logits[rank].assign(*logits, *logits + batch.num_tokens() * config.vocab_size);
    computed.routes[rank] = transformer.routes();
    const std::vector<float> dlogits = RankDlogits(config, batch, rank);
    ASSERT_TRUE(transformer.Backward(dlogits.data()).ok());
    adapters[rank] = lora.parameters();
  };
  if (expert_parallel.has_value()) {
    OnRanks(ranks, [&](int rank, Communicator& group) {
      auto exchange =
          placements.has_value()
              ? ExpertParallelExchange::Create(group, config.num_experts, *placements)
              : ExpertParallelExchange::Create(group, config.num_experts, config.num_moe_layers());
      ASSERT_TRUE(exchange.ok()) << exchange.status();
      run(rank, exchange->get(), &group);
      computed.bytes_sent[rank] = (*exchange)->bytes_sent();
      computed.rows_computed[rank] = (*exchange)->rows_computed();
    });
  } else {
    for (int rank = 0; rank < ranks; ++rank) run(rank, nullptr, nullptr);
  }
  for (const std::string& name : adapters[0].names()) {
    std::vector<float>& joined = computed.gradients[name];
    for (const ParameterSet& adapter : adapters) {
      const Parameter& parameter = *adapter.Find(name);
      if (expert_parallel == Ownership::kSharded && parameter.stacked_experts) {
        // Each held expert's rows added at its global place: a replica's share of the
        // gradient to its owner's.
        const int64_t expert_size = parameter.size() / parameter.shape[0];
        joined.resize(expert_size * config.num_experts, 0.0f);
        for (size_t i = 0; i < parameter.experts.size(); ++i) {
          const float* held = parameter.grad.data() + i * expert_size;
          float* global = joined.data() + parameter.experts[i] * expert_size;
          for (int64_t j = 0; j < expert_size; ++j) global[j] += held[j];
        }
      } else {
        joined.resize(parameter.grad.size(), 0.0f);
        for (size_t i = 0; i < joined.size(); ++i) joined[i] += parameter.grad[i];
      }
    }
  }
  return computed;
}

// Bound on fp32 summation-order error between one rank and several (relative, or absolute
// below 1): the gradients sum the experts' rows in another order. Below 1e-5 with OpenBLAS's
// Intel kernels; up to 1.2e-4 with its AMD EPYC ones. A wrong route or exchange is off by the
// gradients' own size.
constexpr double kBound = 5e-4;

// Each rank's logits equal one rank's, the routes are the same logical ids, and the adapter
// gradients agree tensor by tensor.
void ExpectSameResults(const Computed& one, const Computed& parallel, int ranks) {
  for (int rank = 0; rank < ranks; ++rank) {
    EXPECT_LT(MaxRelativeDifference(one.logits[rank], parallel.logits[rank]), kBound) << rank;
  }
  EXPECT_EQ(one.routes, parallel.routes);
  ASSERT_EQ(one.gradients.size(), parallel.gradients.size());
  for (const auto& [name, gradient] : one.gradients) {
    EXPECT_LT(MaxRelativeDifference(gradient, parallel.gradients.at(name)), kBound) << name;
  }
}

class ExpertParallelTest
    : public ::testing::TestWithParam<std::tuple<test_models::NamedConfig, ExpertLayout, int>> {};

// Each rank holds only its experts' base weights and LoRA: 1/ranks of the expert floats.
TEST_P(ExpertParallelTest, RanksHoldingOnlyTheirExpertsComputeWhatOneRankComputes) {
  const auto& [named, layout, ranks] = GetParam();
  const BaseModel base = test_models::RandomModel(named.make(), 1);
  const Computed one = Compute(base, layout, ranks, std::nullopt);
  const Computed parallel = Compute(base, layout, ranks, Ownership::kSharded);
  ExpectSameResults(one, parallel, ranks);
  const placement::LayerPlacements contiguous = placement::LayerPlacements::Uniform(
      placement::ExpertPlacement::Contiguous(base.config().num_experts, ranks),
      base.config().num_moe_layers());
  EXPECT_EQ(parallel.bytes_sent, AnalyticBytes(parallel.routes, base.config(), contiguous));
  EXPECT_EQ(parallel.rows_computed, AnalyticRows(parallel.routes, base.config(), contiguous));
  if (layout == ExpertLayout::kPerExpert) {
    EXPECT_EQ(parallel.expert_floats * ranks, one.expert_floats);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, ExpertParallelTest,
                         ::testing::Combine(::testing::ValuesIn(test_models::kConfigs),
                                            ::testing::Values(ExpertLayout::kPerExpert,
                                                              ExpertLayout::kShared,
                                                              ExpertLayout::kSharedOuter),
                                            ::testing::Values(2, 4)),
                         [](const auto& info) {
                           return absl::StrCat(std::get<0>(info.param).name, "_",
                                               ExpertLayoutName(std::get<1>(info.param)), "_",
                                               std::get<2>(info.param), "ranks");
                         });

// Experts scattered over the ranks, each rank holding its own in descending order: rank r of R
// computes the experts e with e % R == R - 1 - r. The same results, and the traffic the routes
// imply under that placement.
TEST(ExpertParallelExchangeTest, AScatteredPlacementComputesWhatOneRankComputes) {
  for (const test_models::NamedConfig& named :
       {test_models::kConfigs[0], test_models::kConfigs[2]}) {
    for (int ranks : {2, 4}) {
      SCOPED_TRACE(absl::StrCat(named.name, ", ", ranks, " ranks"));
      const BaseModel base = test_models::RandomModel(named.make(), 1);
      const int experts = base.config().num_experts;
      placement::ExpertPlacement scattered;
      for (int rank = 0; rank < ranks; ++rank) {
        std::vector<int>& held = scattered.experts.emplace_back();
        for (int e = experts - 1; e >= 0; --e) {
          if (e % ranks == ranks - 1 - rank) held.push_back(e);
        }
      }
      const placement::LayerPlacements everywhere =
          placement::LayerPlacements::Uniform(scattered, base.config().num_moe_layers());
      const Computed one = Compute(base, ExpertLayout::kPerExpert, ranks, std::nullopt);
      const Computed parallel =
          Compute(base, ExpertLayout::kPerExpert, ranks, Ownership::kSharded, everywhere);
      ExpectSameResults(one, parallel, ranks);
      EXPECT_EQ(parallel.bytes_sent, AnalyticBytes(parallel.routes, base.config(), everywhere));
      EXPECT_EQ(parallel.rows_computed, AnalyticRows(parallel.routes, base.config(), everywhere));
    }
  }
}

// Replicas of hot experts (ReLibra's intra-step replication): rank r also computes the first
// expert of rank r + 1, and with 4 ranks rank 0 that of rank 2 too (three copies of it); one
// expert splits its rows 1 : 3 between owner and replica, the others evenly. The same results
// once each replica's gradients are added to its owner's, and the same rows computed in all.
TEST(ExpertParallelExchangeTest, ReplicasComputeWhatOneRankComputes) {
  for (const test_models::NamedConfig& named :
       {test_models::kConfigs[0], test_models::kConfigs[2]}) {
    for (int ranks : {2, 4}) {
      SCOPED_TRACE(absl::StrCat(named.name, ", ", ranks, " ranks"));
      const BaseModel base = test_models::RandomModel(named.make(), 1);
      placement::ExpertPlacement replicated =
          placement::ExpertPlacement::Contiguous(base.config().num_experts, ranks);
      for (int rank = 0; rank < ranks; ++rank) {
        replicated.replicas.push_back({replicated.experts[(rank + 1) % ranks][0]});
      }
      if (ranks == 4) replicated.replicas[0].push_back(replicated.experts[2][0]);
      replicated.shares[replicated.experts[1][0]] = {1, 3};
      const placement::LayerPlacements everywhere =
          placement::LayerPlacements::Uniform(replicated, base.config().num_moe_layers());
      const Computed one = Compute(base, ExpertLayout::kPerExpert, ranks, std::nullopt);
      const Computed parallel =
          Compute(base, ExpertLayout::kPerExpert, ranks, Ownership::kSharded, everywhere);
      ExpectSameResults(one, parallel, ranks);
      const std::vector<int64_t> owned_rows =
          AnalyticRows(parallel.routes, base.config(), everywhere.Owned());
      EXPECT_EQ(std::accumulate(parallel.rows_computed.begin(), parallel.rows_computed.end(), 0L),
                std::accumulate(owned_rows.begin(), owned_rows.end(), 0L));
      EXPECT_NE(parallel.rows_computed, owned_rows);  // The replicas took rows.
    }
  }
}

// Each MoE layer placed its own way, as per-layer balancing leaves them: the first MoE layer's
// experts scattered in descending order, the second's contiguous with one replica per rank (of
// the next rank's first expert), any further layer rotated by one rank. The same results, and
// each layer's traffic and rows at that layer's owners.
TEST(ExpertParallelExchangeTest, EachMoeLayerPlacedItsOwnWayComputesWhatOneRankComputes) {
  for (const test_models::NamedConfig& named :
       {test_models::kConfigs[0], test_models::kConfigs[2]}) {
    for (int ranks : {2, 4}) {
      SCOPED_TRACE(absl::StrCat(named.name, ", ", ranks, " ranks"));
      const BaseModel base = test_models::RandomModel(named.make(), 1);
      const int experts = base.config().num_experts, layers = base.config().num_moe_layers();
      ASSERT_GE(layers, 2);
      const placement::ExpertPlacement contiguous =
          placement::ExpertPlacement::Contiguous(experts, ranks);
      placement::LayerPlacements placements;
      placement::ExpertPlacement& scattered = placements.layers.emplace_back();
      for (int rank = 0; rank < ranks; ++rank) {
        std::vector<int>& held = scattered.experts.emplace_back();
        for (int e = experts - 1; e >= 0; --e) {
          if (e % ranks == ranks - 1 - rank) held.push_back(e);
        }
      }
      placement::ExpertPlacement& replicated = placements.layers.emplace_back(contiguous);
      for (int rank = 0; rank < ranks; ++rank) {
        replicated.replicas.push_back({contiguous.experts[(rank + 1) % ranks][0]});
      }
      for (int layer = 2; layer < layers; ++layer) {
        placement::ExpertPlacement& rotated = placements.layers.emplace_back(contiguous);
        std::rotate(rotated.experts.begin(), rotated.experts.begin() + 1, rotated.experts.end());
      }
      const Computed one = Compute(base, ExpertLayout::kPerExpert, ranks, std::nullopt);
      const Computed parallel =
          Compute(base, ExpertLayout::kPerExpert, ranks, Ownership::kSharded, placements);
      ExpectSameResults(one, parallel, ranks);
      const std::vector<int64_t> owned_rows =
          AnalyticRows(parallel.routes, base.config(), placements.Owned());
      EXPECT_EQ(std::accumulate(parallel.rows_computed.begin(), parallel.rows_computed.end(), 0L),
                std::accumulate(owned_rows.begin(), owned_rows.end(), 0L));
    }
  }
}

TEST(ExpertParallelExchangeTest, ReplicasOfHeldExpertsAndBadSharesAreRefused) {
  const placement::ExpertPlacement owned = placement::ExpertPlacement::Contiguous(4, 2);
  const auto with = [&owned](std::vector<std::vector<int>> replicas,
                             std::map<int, std::vector<int64_t>> shares = {}) {
    placement::ExpertPlacement made = owned;
    made.replicas = std::move(replicas);
    made.shares = std::move(shares);
    return made;
  };
  EXPECT_TRUE(placement::ValidatePlacement(with({{2}, {0}}, {{2, {1, 2}}}), 4, 2).ok());
  for (const placement::ExpertPlacement& bad :
       {with({{2}}), with({{0}, {}}), with({{2, 2}, {}}), with({{4}, {}}),
        with({{2}, {}}, {{2, {1}}}), with({{2}, {}}, {{2, {1, 0}}}), with({}, {{2, {1, 1}}})}) {
    EXPECT_EQ(placement::ValidatePlacement(bad, 4, 2).code(), absl::StatusCode::kInvalidArgument);
  }
}

// Two ranks owning experts {0, 1} and {2, 3}, each replicating one of the other's: the replicas
// arrive with their owners' values and zero gradients, give their gradients back to the owners,
// and a rank that drops them alone (after a failure) holds its own experts again, unchanged.
TEST(ExpertReplicasTest, ReplicasCopyOwnersAndGiveGradientsBackOrAreDropped) {
  const ModelConfig config = test_models::TinyConfig();
  placement::ExpertPlacement first_layer =
      placement::ExpertPlacement::Contiguous(config.num_experts, 2);
  first_layer.replicas = {{first_layer.experts[1][0]}, {first_layer.experts[0][1]}};
  // The replicas are the first MoE layer's; the others have none.
  placement::LayerPlacements placements =
      placement::LayerPlacements::Uniform(first_layer.Owned(), config.num_moe_layers());
  placements.layers[0] = first_layer;
  const LoraAdapter whole = Adapter(config, ExpertLayout::kPerExpert);
  std::string name, other;  // A per-expert tensor of the first MoE layer, and one of another.
  for (const std::string& each : whole.parameters().names()) {
    const Parameter& parameter = *whole.parameters().Find(each);
    if (!parameter.stacked_experts) continue;
    if (parameter.moe_layer == 0 && name.empty()) name = each;
    if (parameter.moe_layer != 0 && other.empty()) other = each;
  }
  ASSERT_FALSE(name.empty());
  ASSERT_FALSE(other.empty());
  const int64_t expert_size = whole.parameters().Find(name)->size() / config.num_experts;
  const auto rows_of = [&](const std::vector<float>& values, int index) {
    return std::vector<float>(values.begin() + index * expert_size,
                              values.begin() + (index + 1) * expert_size);
  };
  OnRanks(2, [&](int rank, Communicator& group) {
    LoraAdapter shard = *whole.ExpertShard(first_layer.experts[rank]);
    shard.parameters().EnableGradients();
    Parameter& tensor = *shard.parameters().Find(name);
    std::fill(tensor.grad.begin(), tensor.grad.end(), 1.0f);
    const std::vector<float> own_values = tensor.value;
    ASSERT_TRUE(placement::HoldReplicas(group, placements, shard.parameters()).ok());
    EXPECT_EQ(tensor.experts, first_layer.Computed(rank));
    EXPECT_EQ(shard.parameters().Find(other)->experts, first_layer.experts[rank]);
    const int replica = first_layer.replicas[rank][0];
    EXPECT_EQ(rows_of(tensor.value, 2), rows_of(whole.parameters().Find(name)->value, replica));
    EXPECT_EQ(rows_of(tensor.grad, 2), std::vector<float>(expert_size, 0.0f));
    std::fill(tensor.grad.begin() + 2 * expert_size, tensor.grad.end(), 2.0f);
    ASSERT_TRUE(placement::ReleaseReplicas(group, placements, shard.parameters()).ok());
    EXPECT_EQ(tensor.experts, first_layer.experts[rank]);
    EXPECT_EQ(tensor.value, own_values);
    // Rank 0's expert 1 and rank 1's expert 2 (index 1 and 0) got a replica's 2 added.
    const int replicated = rank == 0 ? 1 : 0;
    EXPECT_EQ(rows_of(tensor.grad, replicated), std::vector<float>(expert_size, 3.0f));
    EXPECT_EQ(rows_of(tensor.grad, 1 - replicated), std::vector<float>(expert_size, 1.0f));

    ASSERT_TRUE(placement::HoldReplicas(group, placements, shard.parameters()).ok());
    placement::DropReplicas(placements, rank, shard.parameters());
    EXPECT_EQ(tensor.experts, first_layer.experts[rank]);
    EXPECT_EQ(tensor.value, own_values);
    EXPECT_EQ(tensor.shape[0], 2);
  });
}

TEST(ExpertParallelExchangeTest, PlacementsThatLoseOrRepeatAnExpertAreRefused) {
  gloo::rendezvous::HashStore store;
  auto group = GlooCommunicator::Create(store, 0, 1, {});
  ASSERT_TRUE(group.ok());
  for (const placement::ExpertPlacement& bad :
       {placement::ExpertPlacement{{{0, 1, 2}}}, placement::ExpertPlacement{{{0, 1, 1, 3}}},
        placement::ExpertPlacement{{{0, 1, 2, 4}}}, placement::ExpertPlacement{{{0, 1}, {2, 3}}}}) {
    EXPECT_EQ(
        ExpertParallelExchange::Create(**group, 4, placement::LayerPlacements::Uniform(bad, 2))
            .status()
            .code(),
        absl::StatusCode::kInvalidArgument);
  }
  // A layer that loses an expert is named.
  placement::LayerPlacements second_bad =
      placement::LayerPlacements::Uniform(placement::ExpertPlacement::Contiguous(4, 1), 2);
  second_bad.layers[1] = placement::ExpertPlacement{{{0, 1, 2}}};
  const absl::Status refused = ExpertParallelExchange::Create(**group, 4, second_bad).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("MoE layer 1"));
}

// A rank may also hold every expert and compute its share.
TEST(ExpertParallelExchangeTest, RanksHoldingEveryExpertComputeTheirShare) {
  const BaseModel base = test_models::RandomModel(test_models::QwenShapedConfig(), 1);
  ExpectSameResults(Compute(base, ExpertLayout::kPerExpert, 2, std::nullopt),
                    Compute(base, ExpertLayout::kPerExpert, 2, Ownership::kReplicated), 2);
}

// A rank whose model lacks an expert it must compute says so instead of reading past its
// weights.
TEST(ExpertParallelExchangeTest, AModelWithoutTheLocalExpertsIsRefused) {
  const BaseModel base = test_models::RandomModel(test_models::TinyConfig(), 1);
  OnRanks(2, [&](int rank, Communicator& group) {
    auto exchange = ExpertParallelExchange::Create(group, base.config().num_experts,
                                                   base.config().num_moe_layers());
    ASSERT_TRUE(exchange.ok());
    BaseModel wrong = *base.ExpertShard(rank == 0 ? 2 : 0, 2);  // The other rank's experts.
    Transformer transformer(wrong, nullptr, std::make_unique<CpuModelOps>(wrong.config()),
                            Precision::kF32, exchange->get());
    const absl::Status status = transformer.Forward(RankBatch(base.config(), rank)).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(status.message(), HasSubstr("does not hold"));
  });
}

// Rank 0 routes 1, 2, 0, 3 rows to experts 0..3 and rank 1 routes 2, 0, 3, 0: rank 0 computes
// experts 0 and 1, rank 1 experts 2 and 3, each expert's rows in source-rank order.
TEST(ExpertParallelExchangeTest, RowsReachTheirExpertsRankGroupedByExpertAndComeBack) {
  const std::vector<std::vector<int>> offsets = {{0, 1, 3, 3, 6}, {0, 2, 2, 5, 5}};
  // Rank 0: expert 0 gets its row 0 and rank 1's rows 0, 1; expert 1 its rows 1, 2. Rank 1:
  // expert 2 gets its own rows 2, 3, 4; expert 3 rank 0's rows 3, 4, 5.
  const std::vector<std::vector<float>> want_local = {{0, 200, 201, 1, 2},
                                                      {202, 203, 204, 3, 4, 5}};
  OnRanks(2, [&](int rank, Communicator& group) {
    auto exchange = ExpertParallelExchange::Create(group, 4, 1);
    ASSERT_TRUE(exchange.ok());
    EXPECT_THAT((*exchange)->local_experts(0)->experts,
                rank == 0 ? ElementsAre(0, 1) : ElementsAre(2, 3));
    auto plan = (*exchange)->Plan(0, offsets[rank]);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_THAT(plan->local_offsets, rank == 0 ? ElementsAre(0, 3, 5) : ElementsAre(0, 3, 6));
    CpuModelOps ops(test_models::TinyConfig());
    auto on_host = [&](const Buffer<float>& buffer) {
      std::vector<float> values(buffer.size());
      ops.CopyOut(buffer.ref(), values.data(), buffer.size());
      return values;
    };
    std::vector<float> sent(offsets[rank].back());  // Row i of rank r holds 200 r + i.
    for (size_t i = 0; i < sent.size(); ++i) sent[i] = 200.0f * rank + i;
    Buffer<float> rows;
    ops.Upload(sent.data(), sent.size(), rows);
    ASSERT_TRUE((*exchange)->Dispatch(*plan, 1, rows, ops).ok());
    EXPECT_EQ(on_host(rows), want_local[rank]);
    ops.Scale(rows.ref(), 2, rows.size());
    ASSERT_TRUE((*exchange)->Combine(*plan, 1, rows, ops).ok());
    for (float& value : sent) value *= 2;
    EXPECT_EQ(on_host(rows), sent);
  });
}

TEST(ExpertParallelExchangeTest, ExpertsThatDoNotSplitEvenlyAndWrongOffsetsAreRefused) {
  OnRanks(2, [](int rank, Communicator& group) {
    auto uneven = ExpertParallelExchange::Create(group, 3, 1);
    EXPECT_EQ(uneven.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(uneven.status().message(), HasSubstr("3 experts do not split evenly among 2"));
    auto exchange = ExpertParallelExchange::Create(group, 4, 1);
    ASSERT_TRUE(exchange.ok());
    auto plan = (*exchange)->Plan(1, {0, 1, 1, 1, 1});
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(plan.status().message(), HasSubstr("MoE layer 1 of an exchange for 1"));
    plan = (*exchange)->Plan(0, {0, 1, 2});
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(plan.status().message(), HasSubstr("offsets name 2 experts; the model has 4"));
    plan = (*exchange)->Plan(0, {0, 2, 1, 3, 3});
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(plan.status().message(), HasSubstr("never decrease"));
  });
}

// The exchange reads rows through their addresses between operations, which a backend whose
// memory is not the host's (or not open between calls) cannot allow.
TEST(ExpertParallelExchangeTest, ABackendWithoutHostMemoryIsRefusedBeforeAnyCollective) {
  const BaseModel base = test_models::RandomModel(test_models::TinyConfig(), 1);
  OnRanks(2, [&](int rank, Communicator& group) {
    auto exchange = ExpertParallelExchange::Create(group, base.config().num_experts,
                                                   base.config().num_moe_layers());
    ASSERT_TRUE(exchange.ok());
    BaseModel model = base;
    Transformer transformer(model, nullptr,
                            std::make_unique<testing::CheckedModelOps>(base.config()),
                            Precision::kF32, exchange->get());
    const absl::Status status = transformer.Forward(RankBatch(base.config(), rank)).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(status.message(), HasSubstr("host-memory backend"));
  });
}

}  // namespace
}  // namespace tandem::engine
