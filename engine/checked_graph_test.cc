// The whole model — forward, backward, replay, prefill and decode — run over CheckedModelOps,
// whose memory is unreadable outside its own calls: the graph touches activations only through
// the operations interface, as it must for device memory. Every result equals the CPU
// backend's (routes exactly; floats to the last bits, as OpenBLAS's kernels for some CPUs, AMD
// EPYC's among them, round differently for the checked backend's differently placed buffers),
// no operation got a buffer smaller than it reads or writes, and every operation the model
// needs was called.
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/buffer_access.h"
#include "engine/cpu_model_ops.h"
#include "engine/testing/checked_model_ops.h"
#include "engine/testing/test_models.h"
#include "engine/transformer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::vector<float> Logits(Transformer& transformer, const TokenBatch& batch,
                          const std::vector<int16_t>* replay = nullptr) {
  auto logits = transformer.Forward(batch, replay);
  EXPECT_TRUE(logits.ok()) << logits.status();
  if (!logits.ok()) return {};
  return std::vector<float>(*logits,
                            *logits + batch.num_tokens() * transformer.config().vocab_size);
}

// What one engine computed on the same inputs.
struct Computed {
  std::vector<float> logits, replayed_logits, gradients, decoded_logits, log_probs,
      log_prob_gradients;
  std::vector<int16_t> routes, decoded_routes;
};

Computed RunModel(Transformer& transformer, LoraAdapter& lora) {
  const ModelConfig& config = transformer.config();
  const TokenBatch batch = test_models::TwoSequences();
  Computed run;
  run.logits = Logits(transformer, batch);
  run.routes = transformer.routes();
  std::mt19937_64 rng(4);
  std::normal_distribution<float> normal;
  std::vector<float> dlogits(run.logits.size());
  for (float& value : dlogits) value = normal(rng);
  EXPECT_TRUE(transformer.Backward(dlogits.data()).ok());
  run.gradients = test_models::Gradients(lora.parameters());
  run.replayed_logits = Logits(transformer, batch, &run.routes);

  // Training without the whole logits: every other row scored, at temperature 0.8.
  lora.parameters().ZeroGradients();
  std::vector<int> targets(batch.num_tokens());
  for (size_t t = 0; t < targets.size(); ++t) targets[t] = t % 2 == 0 ? -1 : (3 * t + 1) % 20;
  absl::StatusOr<std::vector<float>> log_probs =
      transformer.ForwardLogProbs(batch, nullptr, targets, 0.8f);
  EXPECT_TRUE(log_probs.ok()) << log_probs.status();
  if (log_probs.ok()) run.log_probs = *log_probs;
  std::vector<float> dlogp(targets.size());
  for (float& value : dlogp) value = normal(rng);
  EXPECT_TRUE(transformer.BackwardLogProbs(dlogp.data()).ok());
  run.log_prob_gradients = test_models::Gradients(lora.parameters());

  // Two prompts prefilled, then three tokens decoded for both.
  const std::vector<std::vector<int>> prompts = {{1, 5, 9, 2}, {7, 3}};
  std::vector<std::unique_ptr<SequenceCache>> caches;
  std::vector<PromptToPrefill> prefill;
  for (const std::vector<int>& prompt : prompts) {
    caches.push_back(*transformer.NewCache(16));
    prefill.push_back({prompt.data(), static_cast<int>(prompt.size()), caches.back().get()});
  }
  const int route_row = config.num_moe_layers() * config.top_k;
  std::vector<float> last(prompts.size() * config.vocab_size);
  std::vector<int16_t> routes((prompts[0].size() + prompts[1].size()) * route_row);
  EXPECT_TRUE(transformer.Prefill(prefill, last.data(), routes.data()).ok());
  run.decoded_logits = last;
  run.decoded_routes = routes;
  std::vector<SequenceCache*> cache_pointers = {caches[0].get(), caches[1].get()};
  std::vector<int> positions = {4, 2};
  for (int step = 0; step < 3; ++step) {
    const std::vector<int> tokens = {(3 * step + 1) % 20, (5 * step + 2) % 20};
    std::vector<int16_t> step_routes(tokens.size() * route_row);
    EXPECT_TRUE(transformer
                    .Decode(tokens.data(), positions.data(), cache_pointers, last.data(),
                            step_routes.data())
                    .ok());
    run.decoded_logits.insert(run.decoded_logits.end(), last.begin(), last.end());
    run.decoded_routes.insert(run.decoded_routes.end(), step_routes.begin(), step_routes.end());
    for (int& position : positions) ++position;
  }
  return run;
}

LoraAdapter Adapter(const ModelConfig& config) {
  LoraAdapter lora = *LoraAdapter::Create(config, test_models::TestLora(config), 2);
  test_models::RandomizeLora(lora, 3);
  lora.parameters().EnableGradients();
  return lora;
}

// `actual` equals `expected` to float32 rounding: within 1e-5 of the largest magnitude.
void ExpectSameFloats(const std::vector<float>& actual, const std::vector<float>& expected,
                      const char* what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  float scale = 0;
  for (float value : expected) scale = std::max(scale, std::abs(value));
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_NEAR(actual[i], expected[i], 1e-5f * scale) << what << " [" << i << "]";
  }
}

class CheckedGraphTest
    : public ::testing::TestWithParam<std::tuple<test_models::NamedConfig, Precision>> {};

TEST_P(CheckedGraphTest, TheGraphTouchesActivationsOnlyThroughOperations) {
  const auto& [named, precision] = GetParam();
  BaseModel base = test_models::RandomModel(named.make(), 1);
  const ModelConfig& config = base.config();
  BaseModel serving = base.ForPrecision(precision);

  LoraAdapter cpu_lora = Adapter(config);
  Transformer cpu(serving, &cpu_lora, std::make_unique<CpuModelOps>(serving.config()), precision);
  const Computed expected = RunModel(cpu, cpu_lora);

  LoraAdapter checked_lora = Adapter(config);
  auto ops = std::make_unique<testing::CheckedModelOps>(config);
  testing::CheckedModelOps& checked_ops = *ops;
  Transformer checked(serving, &checked_lora, std::move(ops), precision);
  const Computed run = RunModel(checked, checked_lora);

  ExpectSameFloats(run.logits, expected.logits, "logits");
  EXPECT_EQ(run.routes, expected.routes);
  ExpectSameFloats(run.gradients, expected.gradients, "gradients");
  ExpectSameFloats(run.replayed_logits, expected.replayed_logits, "replayed logits");
  ExpectSameFloats(run.log_probs, expected.log_probs, "log-probs");
  ExpectSameFloats(run.log_prob_gradients, expected.log_prob_gradients, "log-prob gradients");
  ExpectSameFloats(run.decoded_logits, expected.decoded_logits, "decoded logits");
  EXPECT_EQ(run.decoded_routes, expected.decoded_routes);
  EXPECT_THAT(checked_ops.violations(), IsEmpty());
  std::vector<std::string> needed = {"Linear",
                                     "LinearBackward",
                                     "FoldLogSumExp",
                                     "TokenLogProbsChunkBackward",
                                     "ProjectGroups",
                                     "ProjectGroupsBackward",
                                     "RmsNorm",
                                     "RmsNormBackward",
                                     "Rope",
                                     "RopeBackward",
                                     "CausalAttention",
                                     "CausalAttentionBackward",
                                     "DecodeAttention",
                                     "SwiGlu",
                                     "SwiGluBackward",
                                     "EmbeddingGather",
                                     "RouterScores",
                                     "TopK",
                                     "GateWeights",
                                     "RouterGatesBackward",
                                     "BuildPermutation",
                                     "PermuteRows",
                                     "PermuteRowsBackward",
                                     "UnpermuteAdd",
                                     "UnpermuteAddBackward",
                                     "Add",
                                     "Scale",
                                     "Copy",
                                     "Fill",
                                     "CopyIn",
                                     "CopyOut"};
  if (config.latent_attention()) needed.push_back("CopyColumns");
  if (precision != Precision::kF32) needed.push_back("RoundToBf16");
  if (precision == Precision::kFP8) needed.push_back("QuantizeRowsToE4M3");
  int64_t total = 0;
  for (const auto& [name, count] : checked_ops.calls()) total += count;
  for (const std::string& name : needed) {
    EXPECT_GT(checked_ops.calls().count(name), 0u) << name << " was never called";
  }
  std::printf("%s: %lld operation calls of %zu kinds\n", named.name, static_cast<long long>(total),
              checked_ops.calls().size());
}

INSTANTIATE_TEST_SUITE_P(Shapes, CheckedGraphTest,
                         ::testing::Combine(::testing::ValuesIn(test_models::kConfigs),
                                            ::testing::Values(Precision::kF32, Precision::kFP8)),
                         [](const auto& info) {
                           return absl::StrCat(
                               std::get<0>(info.param).name,
                               std::get<1>(info.param) == Precision::kF32 ? "F32" : "FP8");
                         });

TEST(CheckedModelOpsTest, ReportsATooSmallBuffer) {
  testing::CheckedModelOps ops(test_models::TinyConfig());
  Buffer<float> x = ops.Zeros(4);
  Buffer<float> y = ops.Allocate<float>(8);  // Wants 3 rows × 4 = 12.
  const std::vector<float> host_w(8, 1.0f);
  const WeightRef w = *ops.Bind({.values = host_w.data(), .size = 8});
  ops.Linear(x.ref(), w, y.ref(), 2, 2, 4, /*accumulate=*/false);
  EXPECT_THAT(ops.violations(), ElementsAre());
  ops.Linear(x.ref(), w, y.ref() + 4, 2, 2, 4, /*accumulate=*/false);
  EXPECT_THAT(ops.violations(), ElementsAre("Linear y: 4 < 8"));
  ops.Linear(x.ref(), w + 4, y.ref(), 2, 2, 4, /*accumulate=*/false);  // A [4, 2] weight.
  EXPECT_THAT(ops.violations(), ElementsAre("Linear y: 4 < 8", "Linear w: 4 < 8"));
}

TEST(CheckedModelOpsTest, BindsOnlyTheFormatsItDeclares) {
  testing::CheckedModelOps ops(test_models::TinyConfig());
  EXPECT_TRUE(ops.capabilities().Accepts(WeightFormat::kF32));
  const std::vector<uint16_t> bf16(8);
  const absl::StatusOr<WeightRef> bound =
      ops.Bind({.format = WeightFormat::kBF16, .values = bf16.data(), .size = 8});
  EXPECT_EQ(bound.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bound.status().message(), HasSubstr("not bf16"));
}

TEST(CheckedModelOpsDeathTest, ItsMemoryFaultsWhenReadOutsideItsCalls) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  testing::CheckedModelOps ops(test_models::TinyConfig());
  Buffer<float> x = ops.Zeros(4);
  std::vector<float> host(4, 1.0f);
  ops.CopyOut(x.ref(), host.data(), 4);  // Through an operation: fine.
  EXPECT_EQ(host, std::vector<float>(4, 0.0f));
  const float* address = BufferAccess::Address(Ref<const float>(x.ref()));
  EXPECT_DEATH({ std::printf("%f\n", address[0]); }, "");
}

}  // namespace
}  // namespace tandem::engine
