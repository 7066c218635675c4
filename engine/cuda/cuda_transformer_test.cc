#include "engine/cuda/cuda_transformer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "absl/strings/match.h"
#include "engine/generator.h"
#include "engine/testing/test_models.h"
#include "engine/transformer.h"
#include "kernels/cuda/testing.h"

namespace tandem::engine::cuda {
namespace {

using test_models::NamedConfig;

class CudaTransformerTest : public ::tandem::cuda::CudaTest,
                            public ::testing::WithParamInterface<NamedConfig> {};

class CudaTransformerGpuTest : public ::tandem::cuda::CudaTest {};

INSTANTIATE_TEST_SUITE_P(Shapes, CudaTransformerTest,
                         ::testing::ValuesIn(test_models::StandardAttentionConfigs()),
                         [](const auto& info) { return std::string(info.param.name); });

// Runs everywhere (Create refuses before touching a GPU).
TEST(CudaTransformerCreateTest, LatentAttentionIsRefused) {
  BaseModel model = test_models::RandomModel(test_models::DeepseekV3ShapedConfig(), 16);
  EXPECT_EQ(CudaTransformer::Create(model, nullptr).status().code(),
            absl::StatusCode::kUnimplemented);
}

// Logits and routes of the GPU forward against the CPU Transformer (fp32 both), live and with
// replayed routes (some rows -1: routed live), with a LoRA adapter in each expert layout.
TEST_P(CudaTransformerTest, ForwardMatchesTheCpuTransformer) {
  const ModelConfig config = GetParam().make();
  BaseModel model = test_models::RandomModel(config, 7);
  for (const ExpertLayout layout :
       {ExpertLayout::kPerExpert, ExpertLayout::kShared, ExpertLayout::kSharedOuter}) {
    SCOPED_TRACE(ExpertLayoutName(layout));
    LoraConfig lora_config = test_models::TestLora(config);
    lora_config.expert_layout = layout;
    absl::StatusOr<LoraAdapter> lora = LoraAdapter::Create(config, lora_config, 8);
    ASSERT_TRUE(lora.ok()) << lora.status();
    test_models::RandomizeLora(*lora, 9);
    absl::StatusOr<std::unique_ptr<CudaTransformer>> gpu = CudaTransformer::Create(model, &*lora);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    Transformer cpu(model, &*lora);
    const TokenBatch batch = test_models::TwoSequences();
    const int64_t logits_size = int64_t{batch.num_tokens()} * config.vocab_size;

    absl::StatusOr<const float*> expected = cpu.Forward(batch);
    ASSERT_TRUE(expected.ok()) << expected.status();
    const std::vector<float> cpu_logits(*expected, *expected + logits_size);
    absl::StatusOr<const float*> actual = (*gpu)->Forward(batch, nullptr);
    ASSERT_TRUE(actual.ok()) << actual.status();
    ::tandem::cuda::ExpectAllNear(std::vector<float>(*actual, *actual + logits_size), cpu_logits,
                                  1e-4f, 1e-4f);
    // fp32 on both sides: the routing decisions are identical.
    EXPECT_EQ((*gpu)->routes(), cpu.routes());

    // Replay: live routes of another batch order, every third row left to live routing.
    std::vector<int16_t> replay = cpu.routes();
    std::reverse(replay.begin(), replay.end());
    for (size_t row = 0; row < replay.size() / config.top_k; row += 3) {
      std::fill_n(replay.begin() + row * config.top_k, config.top_k, int16_t{-1});
    }
    for (size_t row = 0; row < replay.size() / config.top_k; ++row) {
      std::sort(replay.begin() + row * config.top_k, replay.begin() + (row + 1) * config.top_k);
    }
    absl::StatusOr<const float*> replayed_cpu = cpu.Forward(batch, &replay);
    absl::StatusOr<const float*> replayed_gpu = (*gpu)->Forward(batch, &replay);
    ASSERT_TRUE(replayed_cpu.ok() && replayed_gpu.ok());
    ::tandem::cuda::ExpectAllNear(std::vector<float>(*replayed_gpu, *replayed_gpu + logits_size),
                                  std::vector<float>(*replayed_cpu, *replayed_cpu + logits_size),
                                  1e-4f, 1e-4f);
    EXPECT_EQ((*gpu)->routes(), cpu.routes());
    EXPECT_EQ((*gpu)->live_routes(), cpu.live_routes());
    EXPECT_EQ((*gpu)->routing_stats().differing_decisions, cpu.routing_stats().differing_decisions);
    EXPECT_EQ((*gpu)->routing_stats().live_fallbacks, cpu.routing_stats().live_fallbacks);
  }
}

// The CPU Transformer's adapter gradients for dlogits and dhidden; leaves the adapter's
// gradients zero.
std::vector<float> CpuAdapterGradients(BaseModel& model, LoraAdapter& lora,
                                       const TokenBatch& batch, const std::vector<float>& dlogits,
                                       const std::vector<float>& dhidden) {
  Transformer cpu(model, &lora);
  EXPECT_TRUE(cpu.Forward(batch).ok());
  EXPECT_TRUE(cpu.Backward(dlogits.data(), dhidden.data()).ok());
  std::vector<float> gradients = test_models::Gradients(lora.parameters());
  lora.parameters().ZeroGradients();
  return gradients;
}

// `model` with every base weight scaled by 1 + u, u uniform in [-size, size] (draw `draw`).
BaseModel Perturbed(const BaseModel& model, float size, int draw) {
  BaseModel perturbed = model;
  std::mt19937 generator(100 + draw);
  std::uniform_real_distribution<float> noise(-size, size);
  for (const std::string& name : perturbed.parameters().names()) {
    for (float& value : perturbed.parameters().Find(name)->value) value *= 1 + noise(generator);
  }
  return perturbed;
}

// The adapter's gradients from the GPU backward (through routing, attention, norms, the
// residual stream and a value head's dhidden) against the CPU Transformer's, in each layout.
TEST_P(CudaTransformerTest, BackwardGivesTheCpuAdapterGradients) {
  const ModelConfig config = GetParam().make();
  BaseModel model = test_models::RandomModel(config, 21);
  BaseModel nearby[] = {Perturbed(model, 1e-5f, 0), Perturbed(model, 1e-5f, 1)};
  const TokenBatch batch = test_models::TwoSequences();
  const std::vector<float> dlogits =
      ::tandem::cuda::RandomFloats(int64_t{batch.num_tokens()} * config.vocab_size, 22);
  const std::vector<float> dhidden =
      ::tandem::cuda::RandomFloats(int64_t{batch.num_tokens()} * config.d_model, 23);
  for (const ExpertLayout layout :
       {ExpertLayout::kPerExpert, ExpertLayout::kShared, ExpertLayout::kSharedOuter}) {
    SCOPED_TRACE(ExpertLayoutName(layout));
    LoraConfig lora_config = test_models::TestLora(config);
    lora_config.expert_layout = layout;
    absl::StatusOr<LoraAdapter> lora = LoraAdapter::Create(config, lora_config, 24);
    ASSERT_TRUE(lora.ok()) << lora.status();
    test_models::RandomizeLora(*lora, 25);
    lora->parameters().EnableGradients();
    const std::vector<float> expected =
        CpuAdapterGradients(model, *lora, batch, dlogits, dhidden);
    // Some gradients of these small random models are ill-conditioned: OlmoeShaped's in the
    // shared layout move by up to 2.5e-2 (of up to 48) when the base weights move by 1e-7
    // relative, a float rounding, and two CPUs (OpenBLAS on AVX2 and on AVX-512) already
    // disagree by 2.4e-3. So each gradient may differ from the CPU's by as much as the CPU's own
    // moves when the weights move by 1e-5 relative (the larger of two draws); that is tight
    // wherever a gradient is well defined in fp32.
    std::vector<float> sensitivity(expected.size(), 0.0f);
    for (BaseModel& nearby_model : nearby) {
      const std::vector<float> moved =
          CpuAdapterGradients(nearby_model, *lora, batch, dlogits, dhidden);
      for (size_t i = 0; i < moved.size(); ++i) {
        sensitivity[i] = std::max(sensitivity[i], std::fabs(moved[i] - expected[i]));
      }
    }

    absl::StatusOr<std::unique_ptr<CudaTransformer>> gpu = CudaTransformer::Create(model, &*lora);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    ASSERT_TRUE((*gpu)->Forward(batch, nullptr).ok());
    const absl::Status backward = (*gpu)->Backward(dlogits.data(), dhidden.data());
    ASSERT_TRUE(backward.ok()) << backward;
    const std::vector<float> actual = test_models::Gradients(lora->parameters());
    ASSERT_EQ(actual.size(), expected.size());
    int differing = 0;
    for (size_t i = 0; i < actual.size(); ++i) {
      const float bound = 1e-3f + 1e-3f * std::fabs(expected[i]) + sensitivity[i];
      if (std::fabs(actual[i] - expected[i]) > bound && differing++ < 5) {
        ADD_FAILURE() << "gradient " << i << ": " << actual[i] << " vs expected " << expected[i]
                      << " (bound " << bound << ", of which the CPU's own sensitivity "
                      << sensitivity[i] << ")";
      }
    }
    EXPECT_EQ(differing, 0) << differing << " of " << actual.size() << " gradients differ";
  }
}

// Generation on the GPU (device caches, prefill and decode) against the CPU Transformer's: the
// same tokens, routes and log-probs, greedy and sampled, with a sequence moving to another
// adapter (sharing the device base model) half way. The prompts, of three lengths, are admitted
// together: the GPU prefills them in one pass, the CPU one by one.
TEST_P(CudaTransformerTest, GenerationMatchesTheCpu) {
  const ModelConfig config = GetParam().make();
  BaseModel model = test_models::RandomModel(config, 31);
  absl::StatusOr<LoraAdapter> first =
      LoraAdapter::Create(config, test_models::TestLora(config), 32);
  absl::StatusOr<LoraAdapter> second =
      LoraAdapter::Create(config, test_models::TestLora(config), 33);
  ASSERT_TRUE(first.ok() && second.ok());
  test_models::RandomizeLora(*first, 34);
  test_models::RandomizeLora(*second, 35);
  absl::StatusOr<std::unique_ptr<CudaTransformer>> gpu_first =
      CudaTransformer::Create(model, &*first);
  ASSERT_TRUE(gpu_first.ok()) << gpu_first.status();
  absl::StatusOr<std::unique_ptr<CudaTransformer>> gpu_second =
      CudaTransformer::Create(model, &*second, {.base = (*gpu_first)->base()});
  ASSERT_TRUE(gpu_second.ok()) << gpu_second.status();
  Transformer cpu_first(model, &*first), cpu_second(model, &*second);

  const auto generate = [&](DecodeEngine& a, DecodeEngine& b) {
    GenerationBatch batch(a);
    std::vector<GenerationBatch::Admission> admissions;
    for (int i = 0; i < 3; ++i) {
      GenerationRequest request{.prompt = {1, 4 + i, 7}, .max_new_tokens = 6, .seed = 40u + i};
      request.prompt.resize(3 + 2 * i, 2 + i);
      if (i == 2) request.sampling.temperature = 0;  // Greedy.
      admissions.push_back({.request = request});
    }
    std::vector<int> ids;
    for (const absl::StatusOr<int>& id : batch.AdmitAll(admissions)) {
      EXPECT_TRUE(id.ok()) << id.status();
      ids.push_back(id.ok() ? *id : -1);
    }
    for (int step = 0; batch.active() > 0; ++step) {
      if (step == 2) batch.SwitchEngine(ids[0], b);
      EXPECT_TRUE(batch.Step().ok());
    }
    std::map<int, GeneratedSample> samples;
    for (auto& [id, sample] : batch.TakeFinished()) samples[id] = std::move(sample);
    return samples;
  };
  std::map<int, GeneratedSample> expected = generate(cpu_first, cpu_second);
  std::map<int, GeneratedSample> actual = generate(**gpu_first, **gpu_second);
  ASSERT_EQ(actual.size(), expected.size());
  for (auto& [id, sample] : expected) {
    SCOPED_TRACE(id);
    EXPECT_EQ(actual[id].tokens, sample.tokens);
    EXPECT_EQ(actual[id].routes, sample.routes);
    ::tandem::cuda::ExpectAllNear(actual[id].logprobs, sample.logprobs, 1e-4f, 1e-4f);
  }
}

double MeanAbsoluteDifference(const float* a, const float* b, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::abs(double{a[i]} - b[i]);
  return sum / n;
}

// The bf16 inference mode rounds activations where the CPU Transformer does: the GPU's bf16
// logits stay far closer to the CPU's bf16 logits than bf16 is to fp32 (a rounding left out
// would pull them toward fp32). Bit equality is out of reach: float sums in another order
// land a few values on the other side of a bf16 rounding boundary.
TEST_P(CudaTransformerTest, Bf16ModeRoundsLikeTheCpu) {
  const ModelConfig config = GetParam().make();
  BaseModel model = test_models::RandomModel(config, 51).ForPrecision(Precision::kBF16);
  absl::StatusOr<LoraAdapter> lora = LoraAdapter::Create(config, test_models::TestLora(config), 52);
  ASSERT_TRUE(lora.ok());
  test_models::RandomizeLora(*lora, 53);
  LoraAdapter rounded = lora->RoundedToBf16();
  const TokenBatch batch = test_models::TwoSequences();
  const int64_t n = int64_t{batch.num_tokens()} * config.vocab_size;
  Transformer cpu_bf16(model, &rounded, Precision::kBF16);
  Transformer cpu_fp32(model, &rounded, Precision::kF32);
  absl::StatusOr<std::unique_ptr<CudaTransformer>> gpu =
      CudaTransformer::Create(model, &rounded, {.precision = Precision::kBF16});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  absl::StatusOr<const float*> bf16 = cpu_bf16.Forward(batch);
  ASSERT_TRUE(bf16.ok());
  const std::vector<float> expected(*bf16, *bf16 + n);
  absl::StatusOr<const float*> fp32 = cpu_fp32.Forward(batch);
  absl::StatusOr<const float*> actual = (*gpu)->Forward(batch, nullptr);
  ASSERT_TRUE(fp32.ok() && actual.ok());
  const double rounding_effect = MeanAbsoluteDifference(expected.data(), *fp32, n);
  ASSERT_GT(rounding_effect, 0);
  EXPECT_LT(MeanAbsoluteDifference(*actual, expected.data(), n), 0.1 * rounding_effect);
  EXPECT_EQ((*gpu)->Backward(expected.data(), nullptr).code(),
            absl::StatusCode::kFailedPrecondition)
      << "training is fp32";
}

TEST_F(CudaTransformerGpuTest, BackwardNeedsAForwardAndEnabledGradients) {
  const ModelConfig config = test_models::TinyConfig();
  BaseModel model = test_models::RandomModel(config, 26);
  absl::StatusOr<LoraAdapter> lora = LoraAdapter::Create(config, LoraConfig{}, 27);
  ASSERT_TRUE(lora.ok());
  absl::StatusOr<std::unique_ptr<CudaTransformer>> gpu = CudaTransformer::Create(model, &*lora);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const std::vector<float> dlogits(int64_t{12} * config.vocab_size, 1.0f);
  EXPECT_EQ((*gpu)->Backward(dlogits.data(), nullptr).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*gpu)->Forward(test_models::TwoSequences(), nullptr).ok());
  EXPECT_EQ((*gpu)->Backward(dlogits.data(), nullptr).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(CudaTransformerGpuTest, RefreshedAdapterChangesTheGpuForwardLikeTheCpus) {
  const ModelConfig config = test_models::TinyConfig();
  BaseModel model = test_models::RandomModel(config, 11);
  absl::StatusOr<LoraAdapter> lora = LoraAdapter::Create(config, LoraConfig{}, 12);
  ASSERT_TRUE(lora.ok());
  absl::StatusOr<std::unique_ptr<CudaTransformer>> gpu = CudaTransformer::Create(model, &*lora);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  test_models::RandomizeLora(*lora, 13);  // B was zero: the adapter now changes the output.
  ASSERT_TRUE((*gpu)->AdapterChanged().ok());
  Transformer cpu(model, &*lora);
  const TokenBatch batch = test_models::TwoSequences();
  const int64_t size = int64_t{batch.num_tokens()} * config.vocab_size;
  absl::StatusOr<const float*> expected = cpu.Forward(batch);
  absl::StatusOr<const float*> actual = (*gpu)->Forward(batch, nullptr);
  ASSERT_TRUE(expected.ok() && actual.ok());
  ::tandem::cuda::ExpectAllNear(std::vector<float>(*actual, *actual + size),
                                std::vector<float>(*expected, *expected + size), 1e-4f, 1e-4f);
}

TEST_F(CudaTransformerGpuTest, BadInputIsRejectedAsOnTheCpu) {
  const ModelConfig config = test_models::TinyConfig();
  BaseModel model = test_models::RandomModel(config, 14);
  absl::StatusOr<std::unique_ptr<CudaTransformer>> gpu = CudaTransformer::Create(model, nullptr);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  TokenBatch batch;
  batch.Add({1, 2, 99});
  EXPECT_EQ((*gpu)->Forward(batch, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  const TokenBatch good = test_models::TwoSequences();
  const std::vector<int16_t> short_replay(3, 0);
  EXPECT_EQ((*gpu)->Forward(good, &short_replay).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Caches hold 1..max_seq_len positions; a prompt or a decode position must fit its cache.
  EXPECT_EQ((*gpu)->NewCache(config.max_seq_len + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::unique_ptr<SequenceCache>> cache = (*gpu)->NewCache(2);
  ASSERT_TRUE(cache.ok()) << cache.status();
  const std::vector<int> prompt = {1, 2, 3};
  std::vector<float> logits(3 * config.vocab_size);
  std::vector<int16_t> routes(3 * config.num_moe_layers() * config.top_k);
  EXPECT_EQ((*gpu)
                ->Prefill({{.tokens = prompt.data(), .length = 3, .cache = cache->get()}},
                          logits.data(), routes.data())
                .code(),
            absl::StatusCode::kInvalidArgument);
  const int position = 2;
  EXPECT_EQ(
      (*gpu)->Decode(prompt.data(), &position, {cache->get()}, logits.data(), routes.data()).code(),
      absl::StatusCode::kInvalidArgument);
}

// Runs everywhere: Create works where a GPU is visible and says why not where none is.
TEST(CudaTransformerCreateTest, CreateNeedsAGpu) {
  BaseModel model = test_models::RandomModel(test_models::TinyConfig(), 15);
  const absl::StatusCode expected = ::tandem::cuda::VisibleDeviceCount() > 0
                                        ? absl::StatusCode::kOk
                                        : absl::StatusCode::kFailedPrecondition;
  EXPECT_EQ(CudaTransformer::Create(model, nullptr).status().code(), expected);
}

}  // namespace
}  // namespace tandem::engine::cuda
