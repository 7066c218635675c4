#include "engine/transformer.h"

#include <cmath>
#include <random>

#include "absl/container/flat_hash_map.h"
#include "engine/cpu_model_ops.h"
#include "engine/generator.h"
#include "engine/model.h"
#include "engine/testing/test_models.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/int8.h"
#include "kernels/cpu/loss.h"

namespace tandem::engine {
namespace {

using test_models::Gradients;
using test_models::kConfigs;
using test_models::NamedConfig;
using test_models::RandomizeLora;
using test_models::RandomModel;
using test_models::TestLora;
using test_models::TinyConfig;
using test_models::TwoSequences;

using ::testing::HasSubstr;

class ConfigTest : public ::testing::TestWithParam<NamedConfig> {};

INSTANTIATE_TEST_SUITE_P(Shapes, ConfigTest, ::testing::ValuesIn(kConfigs),
                         [](const auto& info) { return std::string(info.param.name); });

std::vector<float> Logits(Transformer& transformer, const TokenBatch& batch,
                          const std::vector<int16_t>* replay = nullptr) {
  auto logits = transformer.Forward(batch, replay);
  EXPECT_TRUE(logits.ok()) << logits.status();
  return std::vector<float>(*logits,
                            *logits + batch.num_tokens() * transformer.config().vocab_size);
}

std::vector<float> RandomWeights(size_t size, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> weights(size);
  for (float& w : weights) w = normal(rng);
  return weights;
}

double Dot(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += double{a[i]} * b[i];
  return sum;
}

TEST_P(ConfigTest, ReplayingLiveRoutesReproducesForwardAndGradientsExactly) {
  BaseModel model = RandomModel(GetParam().make(), 1);
  LoraAdapter adapter = *LoraAdapter::Create(model.config(), TestLora(model.config()), 2);
  RandomizeLora(adapter, 3);
  adapter.parameters().EnableGradients();
  Transformer transformer(model, &adapter, std::make_unique<CpuModelOps>(model.config()));
  const TokenBatch batch = TwoSequences();
  const std::vector<float> dlogits = RandomWeights(batch.num_tokens() * 20, 4);

  const std::vector<float> live = Logits(transformer, batch);
  const std::vector<int16_t> routes = transformer.routes();
  ASSERT_TRUE(transformer.Backward(dlogits.data()).ok());
  const std::vector<float> live_grads = Gradients(adapter.parameters());

  adapter.parameters().ZeroGradients();
  const std::vector<float> replayed = Logits(transformer, batch, &routes);
  ASSERT_TRUE(transformer.Backward(dlogits.data()).ok());
  EXPECT_EQ(live, replayed);
  EXPECT_EQ(live_grads, Gradients(adapter.parameters()));
  EXPECT_EQ(transformer.routing_stats().decisions,
            batch.num_tokens() * model.config().num_moe_layers());
  EXPECT_EQ(transformer.routing_stats().differing_decisions, 0);
  EXPECT_EQ(transformer.routing_stats().differing_tokens, 0);
}

TEST(TransformerTest, ReplayedRoutesAreUsedAndDisagreementIsCounted) {
  BaseModel model = RandomModel(TinyConfig(), 1);
  Transformer transformer(model, nullptr, std::make_unique<CpuModelOps>(model.config()));
  const TokenBatch batch = TwoSequences();
  Logits(transformer, batch);
  const std::vector<int16_t> live = transformer.routes();
  std::vector<int16_t> routes = live;
  // Token 0, last MoE layer (so no later routing depends on it): swap in the two experts
  // live routing did not pick. Token 0, first MoE layer: route live.
  std::vector<int16_t> others;
  for (int16_t e = 0; e < 4; ++e) {
    if (e != routes[2] && e != routes[3]) others.push_back(e);
  }
  routes[2] = others[0];
  routes[3] = others[1];
  routes[0] = routes[1] = -1;
  Logits(transformer, batch, &routes);
  EXPECT_EQ(transformer.routes()[2], others[0]);
  EXPECT_EQ(transformer.routes()[3], others[1]);
  EXPECT_NE(transformer.routes()[0], -1);
  const RoutingStats& stats = transformer.routing_stats();
  EXPECT_EQ(stats.live_fallbacks, 1);
  EXPECT_EQ(stats.decisions, batch.num_tokens() * 2 - 1);
  EXPECT_EQ(stats.differing_decisions, 1);
  EXPECT_EQ(stats.differing_tokens, 1);
  // What live routing chose is kept beside what was used; only the last MoE layer of token 0
  // was replaced, and nothing downstream of it routes, so live routing matches the first pass.
  EXPECT_EQ(transformer.live_routes(), live);
}

TEST(TransformerTest, InvalidReplayIsRejectedWithAClearMessage) {
  BaseModel model = RandomModel(TinyConfig(), 1);
  Transformer transformer(model, nullptr, std::make_unique<CpuModelOps>(model.config()));
  const TokenBatch batch = TwoSequences();
  Logits(transformer, batch);
  const std::vector<int16_t> good = transformer.routes();

  std::vector<int16_t> short_routes(good.begin(), good.end() - 1);
  EXPECT_THAT(transformer.Forward(batch, &short_routes).status().message(),
              HasSubstr("expected tokens × MoE layers × top_k = 12 × 2 × 2 = 48"));
  std::vector<int16_t> out_of_range = good;
  out_of_range[5] = 4;
  EXPECT_THAT(transformer.Forward(batch, &out_of_range).status().message(),
              HasSubstr("replayed routes of layer 1: token 1"));
  std::vector<int16_t> duplicate = good;
  duplicate[0] = duplicate[1];
  EXPECT_EQ(transformer.Forward(batch, &duplicate).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<int16_t> mixed = good;
  mixed[0] = -1;
  EXPECT_EQ(transformer.Forward(batch, &mixed).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TransformerTest, BackwardNeedsTheActivationsOfAForward) {
  BaseModel model = RandomModel(TinyConfig(), 1);
  Transformer transformer(model, nullptr, std::make_unique<CpuModelOps>(model.config()));
  const TokenBatch batch = TwoSequences();
  const std::vector<float> dlogits(batch.num_tokens() * 20, 1.0f);
  EXPECT_EQ(transformer.Backward(dlogits.data()).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(transformer.Forward(batch).ok());
  std::unique_ptr<SequenceCache> cache = *transformer.NewCache(4);
  std::vector<float> last(20);
  const std::vector<int> prompt = {1, 2};
  ASSERT_TRUE(transformer.Prefill({{prompt.data(), 2, cache.get()}}, last.data(), nullptr).ok());
  const absl::Status after_decode = transformer.Backward(dlogits.data());
  EXPECT_EQ(after_decode.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(after_decode.message(), HasSubstr("decode overwrote"));
  ASSERT_TRUE(transformer.Forward(batch).ok());
  EXPECT_TRUE(transformer.Backward(dlogits.data()).ok());
}

// More rows than one chunk of the LM head, with a random target or none (-1) at each.
TokenBatch ManyRows(int vocab, std::vector<int>& targets) {
  std::mt19937 rng(4);
  TokenBatch batch;
  for (int s = 0; s < 10; ++s) {
    std::vector<int> sequence(16);
    for (int& token : sequence) token = static_cast<int>(rng() % vocab);
    batch.Add(sequence);
  }
  targets.resize(batch.num_tokens());
  for (size_t t = 0; t < targets.size(); ++t) {
    targets[t] = t % 3 == 0 ? -1 : static_cast<int>(rng() % vocab);
  }
  return batch;
}

// The tiny vocabulary fits one column chunk of the head; the wide one takes three, the last
// partial, so that each row's log-sum-exp is folded over chunks.
class HeadChunkTest : public ::testing::TestWithParam<int> {};

INSTANTIATE_TEST_SUITE_P(Vocabularies, HeadChunkTest,
                         ::testing::Values(20, 2 * Transformer::kHeadChunkColumns + 37));

TEST_P(HeadChunkTest, LogProbsByTilesOfTheHeadEqualThoseOfTheWholeLogits) {
  ModelConfig config = TinyConfig();
  config.vocab_size = GetParam();
  BaseModel model = RandomModel(config, 1);
  LoraAdapter adapter = *LoraAdapter::Create(model.config(), TestLora(model.config()), 2);
  RandomizeLora(adapter, 3);
  adapter.parameters().EnableGradients();
  Transformer transformer(model, &adapter, std::make_unique<CpuModelOps>(model.config()));
  const int vocab = model.config().vocab_size;
  std::vector<int> targets;
  const TokenBatch batch = ManyRows(vocab, targets);
  const int rows = batch.num_tokens();
  ASSERT_GT(rows, Transformer::kHeadChunkRows);
  const float temperature = 0.7f;

  // The reference: the whole logits / T, and a loss's gradient through them.
  std::vector<float> scaled = Logits(transformer, batch);
  for (float& logit : scaled) logit /= temperature;
  std::vector<float> expected(rows, 0.0f), dlogp(rows), dlogits(scaled.size(), 0.0f);
  for (int t = 0; t < rows; ++t) {
    dlogp[t] = targets[t] < 0 ? 7.0f : 0.1f * static_cast<float>(t % 5 - 2);  // 7: ignored.
    if (targets[t] < 0) continue;
    cpu::TokenLogProbs(&scaled[int64_t{t} * vocab], &targets[t], &expected[t], nullptr, 1, vocab);
    cpu::TokenLogProbsBackward(&scaled[int64_t{t} * vocab], &targets[t], &dlogp[t],
                               &dlogits[int64_t{t} * vocab], 1, vocab);
  }
  for (float& d : dlogits) d /= temperature;
  ASSERT_TRUE(transformer.Backward(dlogits.data()).ok());
  const std::vector<float> expected_gradients = Gradients(adapter.parameters());
  adapter.parameters().ZeroGradients();

  absl::StatusOr<std::vector<float>> logp =
      transformer.ForwardLogProbs(batch, nullptr, targets, temperature);
  ASSERT_TRUE(logp.ok()) << logp.status();
  ASSERT_EQ(logp->size(), expected.size());
  for (int t = 0; t < rows; ++t) {
    EXPECT_NEAR((*logp)[t], expected[t], 1e-6 * std::max(1.0f, std::fabs(expected[t])))
        << "row " << t;
  }
  ASSERT_TRUE(transformer.BackwardLogProbs(dlogp.data()).ok());
  const std::vector<float> gradients = Gradients(adapter.parameters());
  ASSERT_EQ(gradients.size(), expected_gradients.size());
  double largest = 0;
  for (float g : expected_gradients) largest = std::max(largest, double{std::fabs(g)});
  ASSERT_GT(largest, 0);
  for (size_t i = 0; i < gradients.size(); ++i) {
    EXPECT_NEAR(gradients[i], expected_gradients[i], 1e-5 * largest) << i;
  }
}

TEST(TransformerTest, LogProbsRefuseBadTargetsAndTemperatures) {
  BaseModel model = RandomModel(TinyConfig(), 1);
  Transformer transformer(model, nullptr, std::make_unique<CpuModelOps>(model.config()));
  const TokenBatch batch = TwoSequences();
  const std::vector<int> targets(batch.num_tokens(), 1);
  const std::vector<float> dlogp(batch.num_tokens(), 1.0f);
  EXPECT_EQ(transformer.BackwardLogProbs(dlogp.data()).code(),
            absl::StatusCode::kFailedPrecondition);
  const auto refusal = [&](const std::vector<int>& bad_targets, float temperature) {
    return transformer.ForwardLogProbs(batch, nullptr, bad_targets, temperature).status();
  };
  EXPECT_THAT(refusal({1, 2}, 1.0f).message(), HasSubstr("want one per token"));
  std::vector<int> out_of_range = targets;
  out_of_range[3] = 20;
  EXPECT_THAT(refusal(out_of_range, 1.0f).message(), HasSubstr("target 3 is 20"));
  out_of_range[3] = -2;
  EXPECT_EQ(refusal(out_of_range, 1.0f).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refusal(targets, 0.0f).message(), HasSubstr("temperature 0"));
  EXPECT_EQ(refusal(targets, std::nanf("")).code(), absl::StatusCode::kInvalidArgument);
  // A Forward's activations are not a ForwardLogProbs': the logits were kept, not the targets.
  ASSERT_TRUE(transformer.Forward(batch).ok());
  EXPECT_EQ(transformer.BackwardLogProbs(dlogp.data()).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(transformer.ForwardLogProbs(batch, nullptr, targets, 1.0f).ok());
  EXPECT_TRUE(transformer.BackwardLogProbs(dlogp.data()).ok());
}

TEST(TransformerTest, BadTokensAndLengthsAreRejected) {
  BaseModel model = RandomModel(TinyConfig(), 1);
  Transformer transformer(model, nullptr, std::make_unique<CpuModelOps>(model.config()));
  TokenBatch bad_token;
  bad_token.Add({1, 20});
  EXPECT_THAT(transformer.Forward(bad_token).status().message(),
              HasSubstr("token 1 is 20, outside [0, 20)"));
  TokenBatch too_long;
  too_long.Add(std::vector<int>(17, 1));
  EXPECT_THAT(transformer.Forward(too_long).status().message(), HasSubstr("has 17 tokens"));
}

TEST(TransformerTest, LoraWithZeroBEqualsTheBaseModel) {
  BaseModel model = RandomModel(TinyConfig(), 1);
  LoraAdapter adapter = *LoraAdapter::Create(model.config(), LoraConfig{}, 2);  // B = 0.
  Transformer base(model, nullptr, std::make_unique<CpuModelOps>(model.config()));
  Transformer adapted(model, &adapter, std::make_unique<CpuModelOps>(model.config()));
  EXPECT_EQ(Logits(base, TwoSequences()), Logits(adapted, TwoSequences()));
}

// W + scale·B·A for every adapted projection (per expert where the weight is stacked).
BaseModel Merge(const BaseModel& model, LoraAdapter& adapter) {
  BaseModel merged = model;
  const ModelConfig& config = model.config();
  for (int layer = 0; layer < config.num_layers; ++layer) {
    for (const std::string& module : adapter.config().targets) {
      const LoraProjectionLayout lora = *adapter.ProjectionLayout(layer, module);
      const Parameter& lora_a = *adapter.parameters().Find(lora.a);
      const Parameter& lora_b = *adapter.parameters().Find(lora.b);
      Parameter& w = *merged.parameters().Find(ProjectionName(config, layer, module));
      const int groups = w.stacked_experts ? static_cast<int>(w.shape[0]) : 1;
      const int out = static_cast<int>(w.shape[w.shape.size() - 2]);
      const int in = static_cast<int>(w.shape.back());
      for (int g = 0; g < groups; ++g) {
        const float* a = lora_a.value.data() + g * lora.a_group_stride;
        const float* b = lora_b.value.data() + g * lora.b_group_stride;
        for (int o = 0; o < out; ++o) {
          for (int i = 0; i < in; ++i) {
            double delta = 0;
            for (int r = 0; r < lora.rank; ++r)
              delta += double{b[o * lora.rank + r]} * a[r * in + i];
            w.value[(int64_t{g} * out + o) * in + i] += lora.scale * delta;
          }
        }
      }
    }
  }
  return merged;
}

class LoraLayoutTest : public ::testing::TestWithParam<ExpertLayout> {};

TEST_P(LoraLayoutTest, AdapterEqualsMergedWeights) {
  BaseModel model = RandomModel(TinyConfig(), 1);
  LoraConfig lora_config;
  lora_config.rank = 3;
  lora_config.alpha = 6;
  lora_config.expert_layout = GetParam();
  LoraAdapter adapter = *LoraAdapter::Create(model.config(), lora_config, 2);
  RandomizeLora(adapter, 5);
  BaseModel merged = Merge(model, adapter);
  Transformer adapted(model, &adapter, std::make_unique<CpuModelOps>(model.config()));
  const std::vector<float> with_adapter = Logits(adapted, TwoSequences());
  const std::vector<int16_t> routes = adapted.routes();
  Transformer merged_model(merged, nullptr, std::make_unique<CpuModelOps>(merged.config()));
  // Same routes on both sides: a near-tie flipped by rounding must not change the experts.
  const std::vector<float> with_merged = Logits(merged_model, TwoSequences(), &routes);
  ASSERT_EQ(with_adapter.size(), with_merged.size());
  for (size_t i = 0; i < with_adapter.size(); ++i) {
    EXPECT_NEAR(with_adapter[i], with_merged[i], 1e-4) << "logit " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(AllLayouts, LoraLayoutTest,
                         ::testing::Values(ExpertLayout::kPerExpert, ExpertLayout::kShared,
                                           ExpertLayout::kSharedOuter));

TEST(TransformerTest, DenseLayersHaveNoRouteRowsAndIndicesAreGlobal) {
  ModelConfig config = TinyConfig();
  config.num_layers = 4;
  config.num_dense_layers = 2;
  config.scoring = kernels::ScoringFunction::kSigmoid;
  EXPECT_EQ(config.MoeLayerIndices(), (std::vector<int>{2, 3}));
  BaseModel model = RandomModel(config, 1);
  // Only global layer 2 is pushed towards expert 3, through its selection bias.
  model.parameters().Find("model.layers.2.mlp.gate.e_score_correction_bias")->value = {0, 0, 0,
                                                                                       100};
  model.parameters().Find("model.layers.3.mlp.gate.e_score_correction_bias")->value = {0, 0, 0,
                                                                                       -100};
  Transformer transformer(model, nullptr, std::make_unique<CpuModelOps>(model.config()));
  const TokenBatch batch = TwoSequences();
  Logits(transformer, batch);
  const std::vector<int16_t>& routes = transformer.routes();
  ASSERT_EQ(routes.size(), static_cast<size_t>(batch.num_tokens()) * 2 * 2);
  for (int t = 0; t < batch.num_tokens(); ++t) {
    const int16_t* layer2 = &routes[(t * 2 + 0) * 2];
    const int16_t* layer3 = &routes[(t * 2 + 1) * 2];
    EXPECT_TRUE(layer2[0] == 3 || layer2[1] == 3) << "token " << t;
    EXPECT_TRUE(layer3[0] != 3 && layer3[1] != 3) << "token " << t;
  }
}

TEST_P(ConfigTest, DecodeWithKvCacheEqualsFullForward) {
  BaseModel model = RandomModel(GetParam().make(), 1);
  LoraAdapter adapter = *LoraAdapter::Create(model.config(), TestLora(model.config()), 2);
  RandomizeLora(adapter, 3);
  Transformer transformer(model, &adapter, std::make_unique<CpuModelOps>(model.config()));
  std::vector<GenerationRequest> requests(2);
  requests[0].prompt = {1, 5, 7};
  requests[1].prompt = {1, 4, 4, 8, 19};
  for (GenerationRequest& request : requests) {
    request.max_new_tokens = 8;
    request.seed = 7;
  }
  auto samples = Generate(transformer, requests);
  ASSERT_TRUE(samples.ok()) << samples.status();
  for (const GeneratedSample& sample : *samples) {
    const int n = static_cast<int>(sample.tokens.size());
    ASSERT_EQ(sample.routes.size(),
              static_cast<size_t>(n - 1) * model.config().num_moe_layers() * model.config().top_k);
    TokenBatch batch;
    batch.Add(std::vector<int>(sample.tokens.begin(), sample.tokens.end() - 1));
    const std::vector<float> logits = Logits(transformer, batch);
    EXPECT_EQ(transformer.routes(), sample.routes);
    std::vector<float> logp(logits.size());
    cpu::LogSoftmax(logits.data(), logp.data(), n - 1, 20);
    // fp32 both ways, but decode multiplies one row where the full forward multiplies all:
    // BLAS kernels need not round a row alike in both (OpenBLAS's Prescott path does not).
    for (int t = sample.prompt_length; t < n; ++t) {
      EXPECT_NEAR(sample.logprobs[t - sample.prompt_length], logp[(t - 1) * 20 + sample.tokens[t]],
                  1e-4)
          << "token " << t;
    }
  }
}

// Runs `prompt` alone on `transformer` for `tokens` generated tokens (no stop).
GeneratedSample GenerateAlone(Transformer& transformer, const std::vector<int>& prompt,
                              int tokens) {
  GenerationRequest request;
  request.prompt = prompt;
  request.max_new_tokens = tokens;
  request.seed = 5;
  return std::move((*Generate(transformer, {request}))[0]);
}

TEST(GenerationBatchTest, SequencesOnDifferentTransformersDecodeAsIfAlone) {
  BaseModel model = RandomModel(TinyConfig(), 1);
  LoraAdapter first = *LoraAdapter::Create(model.config(), LoraConfig{}, 2);
  LoraAdapter second = *LoraAdapter::Create(model.config(), LoraConfig{}, 3);
  RandomizeLora(first, 4);
  RandomizeLora(second, 5);
  Transformer base(model, nullptr, std::make_unique<CpuModelOps>(model.config())),
      on_first(model, &first, std::make_unique<CpuModelOps>(model.config())),
      on_second(model, &second, std::make_unique<CpuModelOps>(model.config()));
  const std::vector<int> prompt = {1, 5, 7};
  GenerationBatch batch(base);
  GenerationRequest request;
  request.prompt = prompt;
  request.max_new_tokens = 6;
  request.seed = 5;
  const int a = *batch.Admit(request, &on_first);
  const int b = *batch.Admit(request, &on_second);
  const int c = *batch.Admit(request);
  while (batch.active() > 0) ASSERT_TRUE(batch.Step().ok());
  absl::flat_hash_map<int, GeneratedSample> finished;
  for (auto& [id, sample] : batch.TakeFinished()) finished[id] = std::move(sample);
  EXPECT_EQ(finished[a].tokens, GenerateAlone(on_first, prompt, 6).tokens);
  EXPECT_EQ(finished[b].tokens, GenerateAlone(on_second, prompt, 6).tokens);
  EXPECT_EQ(finished[c].tokens, GenerateAlone(base, prompt, 6).tokens);
  EXPECT_NE(finished[a].logprobs, finished[b].logprobs);
}

TEST(GenerationBatchTest, SwitchingTransformerKeepsTheCacheAndChangesLaterTokens) {
  BaseModel model = RandomModel(TinyConfig(), 1);
  LoraAdapter adapter = *LoraAdapter::Create(model.config(), LoraConfig{}, 2);
  RandomizeLora(adapter, 4);
  Transformer base(model, nullptr, std::make_unique<CpuModelOps>(model.config())),
      adapted(model, &adapter, std::make_unique<CpuModelOps>(model.config()));
  GenerationBatch batch(base);
  GenerationRequest request;
  request.prompt = {1, 5, 7};
  request.max_new_tokens = 6;
  request.seed = 5;
  const int id = *batch.Admit(request);
  ASSERT_TRUE(batch.Step().ok());
  EXPECT_EQ(batch.SwitchEngine(id, adapted), 2);
  while (batch.active() > 0) ASSERT_TRUE(batch.Step().ok());
  const GeneratedSample switched = std::move(batch.TakeFinished()[0].second);
  const GeneratedSample unswitched = GenerateAlone(base, request.prompt, 6);
  // The first two tokens came from the base model; the rest from the adapter.
  EXPECT_TRUE(std::equal(unswitched.tokens.begin(), unswitched.tokens.begin() + 5,
                         switched.tokens.begin()));
  EXPECT_NE(std::vector<float>(switched.logprobs.begin() + 2, switched.logprobs.end()),
            std::vector<float>(unswitched.logprobs.begin() + 2, unswitched.logprobs.end()));
  EXPECT_EQ(batch.SwitchEngine(id, adapted), -1) << "finished sequences cannot switch";
}

TEST(GenerationBatchTest, KvCacheIsReservedPerRequestAndFreedOnCancelAndFinish) {
  BaseModel model = RandomModel(TinyConfig(), 1);
  Transformer transformer(model, nullptr, std::make_unique<CpuModelOps>(model.config()));
  GenerationBatch batch(transformer);
  GenerationRequest request;
  request.prompt = {1, 5, 7};
  request.max_new_tokens = 4;
  EXPECT_EQ(batch.ReservedPositions(request), 7);
  const int first = *batch.Admit(request);
  request.max_new_tokens = 100;  // Capped at max_seq_len (16).
  EXPECT_EQ(batch.ReservedPositions(request), 16);
  *batch.Admit(request);
  EXPECT_EQ(batch.kv_cache_bytes(), (7 + 16) * batch.kv_bytes_per_token());
  batch.Cancel(first);
  EXPECT_EQ(batch.kv_cache_bytes(), 16 * batch.kv_bytes_per_token());
  while (batch.active() > 0) ASSERT_TRUE(batch.Step().ok());
  EXPECT_EQ(batch.kv_cache_bytes(), 0);
  const auto finished = batch.TakeFinished();
  ASSERT_EQ(finished.size(), 1u) << "a cancelled sequence never finishes";
  EXPECT_EQ(finished[0].second.tokens.size(), 16u);
  EXPECT_EQ(finished[0].second.finish_reason, FinishReason::kLength);
}

TEST(GenerationBatchTest, StopEndsASequenceKeepingWhatItGenerated) {
  BaseModel model = RandomModel(TinyConfig(), 1);
  Transformer transformer(model, nullptr, std::make_unique<CpuModelOps>(model.config()));
  GenerationBatch batch(transformer);
  GenerationRequest request;
  request.prompt = {1, 5, 7};
  request.max_new_tokens = 8;
  const int id = *batch.Admit(request);
  ASSERT_TRUE(batch.Step().ok());
  EXPECT_TRUE(batch.Stop(id));
  EXPECT_FALSE(batch.Stop(id));
  EXPECT_EQ(batch.active(), 0);
  EXPECT_EQ(batch.kv_cache_bytes(), 0);
  const auto finished = batch.TakeFinished();
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_EQ(finished[0].second.finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(finished[0].second.tokens.size(), 5u) << "prompt + the two generated tokens";
  EXPECT_EQ(finished[0].second.routes.size(), 4u * 2 * 2);
}

// An engine whose decode fails after `good_steps` steps, and whose prefill fails if told to, as
// a GPU fault would: everything else is the real Transformer. Counts its prefill calls.
class FailingDecodeEngine : public DecodeEngine {
 public:
  FailingDecodeEngine(Transformer& transformer, int good_steps, bool fail_prefill = false)
      : transformer_(transformer), good_steps_(good_steps), fail_prefill_(fail_prefill) {}
  const ModelConfig& config() const override { return transformer_.config(); }
  absl::StatusOr<std::unique_ptr<SequenceCache>> NewCache(int positions) override {
    return transformer_.NewCache(positions);
  }
  absl::Status Prefill(const std::vector<PromptToPrefill>& prompts, float* last_logits,
                       int16_t* routes) override {
    ++prefills_;
    if (fail_prefill_) return absl::InternalError("device fault in prefill");
    if (prompts.size() > max_prompts_) return absl::ResourceExhaustedError("out of memory");
    return transformer_.Prefill(prompts, last_logits, routes);
  }
  // Prefills of more prompts than this run out of device memory.
  void LimitPrompts(size_t max_prompts) { max_prompts_ = max_prompts; }
  int prefills() const { return prefills_; }
  absl::Status Decode(const int* tokens, const int* positions,
                      const std::vector<SequenceCache*>& caches, float* logits,
                      int16_t* routes) override {
    if (good_steps_-- <= 0) return absl::InternalError("device fault");
    return transformer_.Decode(tokens, positions, caches, logits, routes);
  }

 private:
  Transformer& transformer_;
  int good_steps_;
  const bool fail_prefill_;
  size_t max_prompts_ = SIZE_MAX;
  int prefills_ = 0;
};

// A prefill too big for the device's memory is retried in halves: every sequence is admitted.
TEST(GenerationBatchTest, APrefillTooBigForTheDeviceIsSplitUntilItFits) {
  BaseModel model = RandomModel(TinyConfig(), 1);
  Transformer transformer(model, nullptr, std::make_unique<CpuModelOps>(model.config()));
  FailingDecodeEngine small(transformer, 100);
  small.LimitPrompts(2);
  GenerationBatch batch(transformer);
  std::vector<GenerationBatch::Admission> admissions;
  for (int i = 0; i < 5; ++i) {
    admissions.push_back(
        {.request = {.prompt = {1, 2 + i, 7}, .max_new_tokens = 2, .seed = 5}, .engine = &small});
  }
  const std::vector<absl::StatusOr<int>> ids = batch.AdmitAll(admissions);
  for (const absl::StatusOr<int>& id : ids) EXPECT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(batch.active(), 5);
  // 5 (refused) -> 2 + 3 (refused) -> 1 + 2: three that fit, after two that did not.
  EXPECT_EQ(small.prefills(), 5);
}

// Admitting several sequences prefills each engine's prompts in one call; a bad request or an
// engine whose prefill fails refuses only its own sequences, and the rest generate as if alone.
TEST(GenerationBatchTest, AdmitAllPrefillsEachEnginesPromptsTogetherAndRefusesOnlyWhatFails) {
  BaseModel model = RandomModel(TinyConfig(), 1);
  Transformer transformer(model, nullptr, std::make_unique<CpuModelOps>(model.config()));
  FailingDecodeEngine healthy(transformer, 100), failing(transformer, 100, true);
  GenerationBatch batch(transformer);
  const GenerationRequest short_prompt{.prompt = {1, 5, 7}, .max_new_tokens = 4, .seed = 5};
  GenerationRequest long_prompt = short_prompt, empty_prompt = short_prompt;
  long_prompt.prompt = {2, 3, 4, 5, 6};
  empty_prompt.prompt.clear();
  const std::vector<absl::StatusOr<int>> ids = batch.AdmitAll({{short_prompt, &healthy},
                                                               {empty_prompt, &healthy},
                                                               {long_prompt, &healthy},
                                                               {short_prompt, &failing}});
  ASSERT_EQ(ids.size(), 4u);
  ASSERT_TRUE(ids[0].ok()) << ids[0].status();
  EXPECT_EQ(ids[1].status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(ids[2].ok()) << ids[2].status();
  EXPECT_EQ(ids[3].status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(healthy.prefills(), 1) << "both of its prompts in one prefill";
  EXPECT_EQ(batch.active(), 2);
  while (batch.active() > 0) ASSERT_TRUE(batch.Step().ok());
  absl::flat_hash_map<int, GeneratedSample> finished;
  for (auto& [id, sample] : batch.TakeFinished()) finished[id] = std::move(sample);
  const GeneratedSample short_alone = GenerateAlone(transformer, short_prompt.prompt, 4);
  const GeneratedSample long_alone = GenerateAlone(transformer, long_prompt.prompt, 4);
  EXPECT_EQ(finished[*ids[0]].tokens, short_alone.tokens);
  EXPECT_EQ(finished[*ids[0]].routes, short_alone.routes);
  EXPECT_EQ(finished[*ids[2]].tokens, long_alone.tokens);
  EXPECT_EQ(finished[*ids[2]].routes, long_alone.routes);
  EXPECT_EQ(finished[*ids[2]].logprobs, long_alone.logprobs);
}

// A failed step ends its engine's sequences with an error and what they had generated; the
// sequences of other engines go on.
TEST(GenerationBatchTest, AFailingEngineEndsItsSequencesWithTheError) {
  BaseModel model = RandomModel(TinyConfig(), 1);
  Transformer transformer(model, nullptr, std::make_unique<CpuModelOps>(model.config()));
  FailingDecodeEngine failing(transformer, 1);
  GenerationBatch batch(transformer);
  GenerationRequest request;
  request.prompt = {1, 5, 7};
  request.max_new_tokens = 6;
  const int doomed = *batch.Admit(request, &failing);
  const int healthy = *batch.Admit(request);
  ASSERT_TRUE(batch.Step().ok());
  const absl::Status failed = batch.Step();
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(batch.active(), 1);
  auto finished = batch.TakeFinished();
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_EQ(finished[0].first, doomed);
  EXPECT_EQ(finished[0].second.finish_reason, FinishReason::kError);
  EXPECT_THAT(finished[0].second.error, HasSubstr("device fault"));
  EXPECT_EQ(finished[0].second.tokens.size(), 5u) << "prompt + the two tokens before the fault";
  while (batch.active() > 0) ASSERT_TRUE(batch.Step().ok());
  finished = batch.TakeFinished();
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_EQ(finished[0].first, healthy);
  EXPECT_EQ(finished[0].second.finish_reason, FinishReason::kLength);
}

// A prefill's logits, computed on each prompt's last row only, are that row's logits of the
// prompt's whole forward.
TEST(TransformerPrefillTest, TheLastLogitsAreThoseOfEachPromptsWholeForward) {
  BaseModel model = RandomModel(TinyConfig(), 1);
  Transformer transformer(model, nullptr, std::make_unique<CpuModelOps>(model.config()));
  const std::vector<int> tokens = {1, 5, 7, 2, 9}, positions = {0, 1, 2, 0, 1};
  std::vector<std::unique_ptr<SequenceCache>> caches;
  caches.push_back(*transformer.NewCache(4));
  caches.push_back(*transformer.NewCache(4));
  std::vector<PromptToPrefill> prompts = {{tokens.data(), 3, caches[0].get()},
                                          {tokens.data() + 3, 2, caches[1].get()}};
  std::vector<float> last(2 * 20);
  ASSERT_TRUE(transformer.Prefill(prompts, last.data(), nullptr).ok());
  for (size_t p = 0; p < prompts.size(); ++p) {
    TokenBatch alone;
    alone.Add(std::vector<int>(prompts[p].tokens, prompts[p].tokens + prompts[p].length));
    const std::vector<float> logits = Logits(transformer, alone);
    const std::vector<float> expected(logits.end() - 20, logits.end());
    for (int v = 0; v < 20; ++v) EXPECT_NEAR(last[p * 20 + v], expected[v], 1e-5) << p;
  }
}

TEST(TransformerPrefillTest, AnEmptyPromptOrOneLongerThanItsCacheIsRefused) {
  BaseModel model = RandomModel(TinyConfig(), 1);
  Transformer transformer(model, nullptr, std::make_unique<CpuModelOps>(model.config()));
  std::unique_ptr<SequenceCache> cache = *transformer.NewCache(2);
  const std::vector<int> prompt = {1, 2, 3};
  std::vector<float> logits(model.config().vocab_size);
  for (const int length : {0, 3}) {
    EXPECT_EQ(transformer
                  .Prefill({{.tokens = prompt.data(), .length = length, .cache = cache.get()}},
                           logits.data(), nullptr)
                  .code(),
              absl::StatusCode::kInvalidArgument)
        << length;
  }
  EXPECT_TRUE(transformer
                  .Prefill({{.tokens = prompt.data(), .length = 2, .cache = cache.get()}},
                           logits.data(), nullptr)
                  .ok());
}

TEST(GenerationBatchTest, AnyStopTokenEndsTheSample) {
  BaseModel model = RandomModel(TinyConfig(), 1);
  Transformer transformer(model, nullptr, std::make_unique<CpuModelOps>(model.config()));
  const GeneratedSample free_running = GenerateAlone(transformer, {1, 5, 7}, 8);
  GenerationRequest request;
  request.prompt = {1, 5, 7};
  request.max_new_tokens = 8;
  request.seed = 5;
  request.stop_tokens = {free_running.tokens[5], 19};
  const GeneratedSample stopped = std::move((*Generate(transformer, {request}))[0]);
  const auto first_stop =
      std::find_first_of(free_running.tokens.begin() + 3, free_running.tokens.end(),
                         request.stop_tokens.begin(), request.stop_tokens.end());
  EXPECT_EQ(stopped.finish_reason, FinishReason::kStop);
  EXPECT_EQ(stopped.tokens, std::vector<int>(free_running.tokens.begin(), first_stop + 1));
}

TEST_P(ConfigTest, WholeModelGradientMatchesFiniteDifferences) {
  BaseModel model = RandomModel(GetParam().make(), 11);
  LoraAdapter adapter = *LoraAdapter::Create(model.config(), TestLora(model.config()), 12);
  RandomizeLora(adapter, 13);
  model.parameters().EnableGradients();
  adapter.parameters().EnableGradients();
  Transformer transformer(model, &adapter, std::make_unique<CpuModelOps>(model.config()));
  const TokenBatch batch = TwoSequences();
  const std::vector<float> weights = RandomWeights(batch.num_tokens() * 20, 14);
  // The loss also reads the final hidden states, as PPO's value head does.
  const std::vector<float> hidden_weights =
      RandomWeights(batch.num_tokens() * model.config().d_model, 16);
  const auto loss = [&](const std::vector<int16_t>* routes) {
    const double logits_term = Dot(Logits(transformer, batch, routes), weights);
    return logits_term + Dot(transformer.final_hidden(), hidden_weights);
  };
  Logits(transformer, batch);
  const std::vector<int16_t> routes = transformer.routes();  // Held fixed: routing is discrete.
  ASSERT_TRUE(transformer.Backward(weights.data(), hidden_weights.data()).ok());

  std::mt19937_64 rng(15);
  int checked = 0;
  for (ParameterSet* parameters : {&model.parameters(), &adapter.parameters()}) {
    for (const std::string& name : parameters->names()) {
      Parameter& parameter = *parameters->Find(name);
      for (int trial = 0; trial < 2; ++trial) {
        const int64_t i = std::uniform_int_distribution<int64_t>(0, parameter.size() - 1)(rng);
        const float original = parameter.value[i];
        const float eps = 2e-3f;  // Small against the curvature the q/k norms add.
        parameter.value[i] = original + eps;
        const double plus = loss(&routes);
        parameter.value[i] = original - eps;
        const double minus = loss(&routes);
        parameter.value[i] = original;
        const double numeric = (plus - minus) / (2 * eps);
        EXPECT_NEAR(parameter.grad[i], numeric, 2e-2 + 2e-2 * std::abs(numeric))
            << name << "[" << i << "]";
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 60);
}

TEST(TransformerTest, Bf16InferenceDisagreesWithFp32TrainingRouting) {
  ModelConfig config = TinyConfig();
  config.num_experts = 8;
  BaseModel model = *BaseModel::Create(config, 21);
  BaseModel rounded = model.RoundedToBf16();
  Transformer inference(rounded, nullptr, std::make_unique<CpuModelOps>(rounded.config()),
                        Precision::kBF16);
  Transformer training(model, nullptr, std::make_unique<CpuModelOps>(model.config()));
  TokenBatch batch;
  std::mt19937_64 rng(22);
  for (int s = 0; s < 16; ++s) {
    std::vector<int> sequence(16);
    for (int& token : sequence) token = std::uniform_int_distribution<int>(0, 19)(rng);
    batch.Add(sequence);
  }
  Logits(inference, batch);
  const std::vector<int16_t> rollout_routes = inference.routes();
  Logits(training, batch, &rollout_routes);
  const RoutingStats& stats = training.routing_stats();
  std::printf("bf16 rollout vs fp32 training: %.2f%% of decisions, %.2f%% of tokens differ\n",
              100 * stats.decision_disagreement(), 100 * stats.token_disagreement());
  EXPECT_GT(stats.differing_decisions, 0);
}

// Generation with the KV cache at `precision` computes what the full forward does.
void ExpectDecodeEqualsFullForward(BaseModel& served, Precision precision) {
  Transformer transformer(served, nullptr, std::make_unique<CpuModelOps>(served.config()),
                          precision);
  GenerationRequest request;
  request.prompt = {1, 5, 7, 2};
  request.max_new_tokens = 8;
  request.seed = 3;
  auto samples = Generate(transformer, {request});
  ASSERT_TRUE(samples.ok()) << samples.status();
  const GeneratedSample& sample = (*samples)[0];
  TokenBatch batch;
  batch.Add(std::vector<int>(sample.tokens.begin(), sample.tokens.end() - 1));
  const std::vector<float> logits = Logits(transformer, batch);
  EXPECT_EQ(transformer.routes(), sample.routes);
  const int n = static_cast<int>(sample.tokens.size());
  std::vector<float> logp(logits.size());
  cpu::LogSoftmax(logits.data(), logp.data(), n - 1, 20);
  for (int t = sample.prompt_length; t < n; ++t) {
    EXPECT_NEAR(sample.logprobs[t - sample.prompt_length], logp[(t - 1) * 20 + sample.tokens[t]],
                1e-4)
        << "token " << t;
  }
}

// FP8 rollout: only the linear projections' weights are quantized (per output channel, to E4M3
// values over bf16), and generation with the KV cache computes what the full forward does.
TEST_P(ConfigTest, Fp8RolloutQuantizesProjectionsAndDecodesLikeItsFullForward) {
  BaseModel model = RandomModel(GetParam().make(), 31);
  BaseModel served = model.ForPrecision(Precision::kFP8);
  for (const std::string& name : model.parameters().names()) {
    const std::vector<float>& original = model.parameters().Find(name)->value;
    const std::vector<float>& quantized = served.parameters().Find(name)->value;
    if (!name.ends_with("_proj.weight") && !name.ends_with("kv_a_proj_with_mqa.weight")) {
      EXPECT_EQ(quantized, model.RoundedToBf16().parameters().Find(name)->value) << name;
      continue;
    }
    EXPECT_NE(quantized, original) << name;
    const int64_t in = model.parameters().Find(name)->shape.back();
    for (int64_t row = 0; row < static_cast<int64_t>(quantized.size()) / in; ++row) {
      float absmax = 0;
      for (int64_t c = 0; c < in; ++c)
        absmax = std::max(absmax, std::fabs(quantized[row * in + c]));
      const float scale = absmax / cpu::kE4M3Max;
      for (int64_t c = 0; c < in; ++c) {
        const float value = quantized[row * in + c] / scale;
        ASSERT_NEAR(value, cpu::RoundToE4M3(value), 1e-3 * std::fabs(value) + 1e-6) << name;
      }
    }
  }
  ExpectDecodeEqualsFullForward(served, Precision::kFP8);
}

// INT8 weight-only rollout: the linear projections' weights land on a per-output-channel grid of
// at most 255 levels (absmax / 127 apart) over bf16, everything else is bf16, and generation with
// the KV cache computes what the full forward does.
TEST_P(ConfigTest, Int8RolloutQuantizesProjectionWeightsOnly) {
  BaseModel model = RandomModel(GetParam().make(), 32);
  BaseModel served = model.ForPrecision(Precision::kInt8);
  const BaseModel rounded = model.RoundedToBf16();
  for (const std::string& name : model.parameters().names()) {
    const std::vector<float>& quantized = served.parameters().Find(name)->value;
    if (!name.ends_with("_proj.weight") && !name.ends_with("kv_a_proj_with_mqa.weight")) {
      EXPECT_EQ(quantized, rounded.parameters().Find(name)->value) << name;
      continue;
    }
    EXPECT_NE(quantized, rounded.parameters().Find(name)->value) << name;
    const int64_t in = model.parameters().Find(name)->shape.back();
    for (int64_t row = 0; row < static_cast<int64_t>(quantized.size()) / in; ++row) {
      float absmax = 0;
      for (int64_t c = 0; c < in; ++c) {
        absmax = std::max(absmax, std::fabs(quantized[row * in + c]));
      }
      const float scale = absmax / cpu::kInt8Max;
      for (int64_t c = 0; c < in; ++c) {
        const float level = quantized[row * in + c] / scale;
        ASSERT_NEAR(level, std::nearbyint(level), 1e-3) << name;
      }
    }
  }
  ExpectDecodeEqualsFullForward(served, Precision::kInt8);
}

}  // namespace
}  // namespace tandem::engine
