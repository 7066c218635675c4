// The services' engines on a GPU (MakeTrainingEngines and MakeDecodeEngineMaker for "cuda:0":
// the one model graph over the CUDA backend) against the same engines on the CPU: forward with
// live and replayed routes, backward into the adapter, generation, the bf16 inference mode, a
// refreshed adapter and bad input. Skips without a GPU, except the tests of what is refused.
#include "engine/cuda/device_engines.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "engine/cpu_model_ops.h"
#include "engine/generator.h"
#include "engine/testing/test_models.h"
#include "engine/transformer.h"
#include "gmock/gmock.h"
#include "kernels/cuda/testing.h"

namespace tandem::engine {
namespace {

using test_models::NamedConfig;

class DeviceEnginesTest : public ::tandem::cuda::CudaTest,
                          public ::testing::WithParamInterface<NamedConfig> {};

class DeviceEnginesGpuTest : public ::tandem::cuda::CudaTest {};

INSTANTIATE_TEST_SUITE_P(Shapes, DeviceEnginesTest,
                         ::testing::ValuesIn(test_models::StandardAttentionConfigs()),
                         [](const auto& info) { return std::string(info.param.name); });

// The policy engine on GPU 0 (the test fails where it cannot be made).
std::unique_ptr<TrainingEngine> GpuPolicy(BaseModel& model, LoraAdapter& lora) {
  absl::StatusOr<TrainingEngines> engines = MakeTrainingEngines("cuda:0", model, lora);
  EXPECT_TRUE(engines.ok()) << engines.status();
  return engines.ok() ? std::move(engines->policy) : nullptr;
}

// Makes decode engines on GPU 0, all over one device copy of the base model.
DecodeEngineMaker GpuDecodeEngines(Precision precision = Precision::kF32) {
  absl::StatusOr<DecodeEngineMaker> maker = MakeDecodeEngineMaker("cuda:0", precision);
  EXPECT_TRUE(maker.ok()) << maker.status();
  return maker.ok() ? *std::move(maker) : nullptr;
}

std::unique_ptr<DecodeEngine> GpuDecodeEngine(DecodeEngineMaker& maker, BaseModel& model,
                                              LoraAdapter* lora) {
  absl::StatusOr<std::unique_ptr<DecodeEngine>> engine = maker(model, lora);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

// Logits and routes of the GPU forward against the CPU Transformer (fp32 both), live and with
// replayed routes (some rows -1: routed live), with a LoRA adapter in each expert layout.
TEST_P(DeviceEnginesTest, ForwardMatchesTheCpuTransformer) {
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
    std::unique_ptr<TrainingEngine> gpu = GpuPolicy(model, *lora);
    ASSERT_NE(gpu, nullptr);
    Transformer cpu(model, &*lora, std::make_unique<CpuModelOps>(model.config()));
    const TokenBatch batch = test_models::TwoSequences();
    const int64_t logits_size = int64_t{batch.num_tokens()} * config.vocab_size;

    absl::StatusOr<const float*> expected = cpu.Forward(batch);
    ASSERT_TRUE(expected.ok()) << expected.status();
    const std::vector<float> cpu_logits(*expected, *expected + logits_size);
    absl::StatusOr<const float*> actual = gpu->Forward(batch, nullptr);
    ASSERT_TRUE(actual.ok()) << actual.status();
    ::tandem::cuda::ExpectAllNear(std::vector<float>(*actual, *actual + logits_size), cpu_logits,
                                  1e-4f, 1e-4f);
    // fp32 on both sides: the routing decisions are identical.
    EXPECT_EQ(gpu->routes(), cpu.routes());

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
    absl::StatusOr<const float*> replayed_gpu = gpu->Forward(batch, &replay);
    ASSERT_TRUE(replayed_cpu.ok() && replayed_gpu.ok());
    ::tandem::cuda::ExpectAllNear(std::vector<float>(*replayed_gpu, *replayed_gpu + logits_size),
                                  std::vector<float>(*replayed_cpu, *replayed_cpu + logits_size),
                                  1e-4f, 1e-4f);
    EXPECT_EQ(gpu->routes(), cpu.routes());
    EXPECT_EQ(gpu->live_routes(), cpu.live_routes());
    EXPECT_EQ(gpu->routing_stats().differing_decisions, cpu.routing_stats().differing_decisions);
    EXPECT_EQ(gpu->routing_stats().live_fallbacks, cpu.routing_stats().live_fallbacks);
  }
}

// The CPU Transformer's adapter gradients for dlogits and dhidden; leaves the adapter's
// gradients zero.
std::vector<float> CpuAdapterGradients(BaseModel& model, LoraAdapter& lora, const TokenBatch& batch,
                                       const std::vector<float>& dlogits,
                                       const std::vector<float>& dhidden) {
  Transformer cpu(model, &lora, std::make_unique<CpuModelOps>(model.config()));
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
TEST_P(DeviceEnginesTest, BackwardGivesTheCpuAdapterGradients) {
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
    const std::vector<float> expected = CpuAdapterGradients(model, *lora, batch, dlogits, dhidden);
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

    std::unique_ptr<TrainingEngine> gpu = GpuPolicy(model, *lora);
    ASSERT_NE(gpu, nullptr);
    ASSERT_TRUE(gpu->Forward(batch, nullptr).ok());
    const absl::Status backward = gpu->Backward(dlogits.data(), dhidden.data());
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
TEST_P(DeviceEnginesTest, GenerationMatchesTheCpu) {
  const ModelConfig config = GetParam().make();
  BaseModel model = test_models::RandomModel(config, 31);
  absl::StatusOr<LoraAdapter> first =
      LoraAdapter::Create(config, test_models::TestLora(config), 32);
  absl::StatusOr<LoraAdapter> second =
      LoraAdapter::Create(config, test_models::TestLora(config), 33);
  ASSERT_TRUE(first.ok() && second.ok());
  test_models::RandomizeLora(*first, 34);
  test_models::RandomizeLora(*second, 35);
  DecodeEngineMaker maker = GpuDecodeEngines();
  std::unique_ptr<DecodeEngine> gpu_first = GpuDecodeEngine(maker, model, &*first);
  std::unique_ptr<DecodeEngine> gpu_second = GpuDecodeEngine(maker, model, &*second);
  ASSERT_TRUE(gpu_first != nullptr && gpu_second != nullptr);
  Transformer cpu_first(model, &*first, std::make_unique<CpuModelOps>(model.config())),
      cpu_second(model, &*second, std::make_unique<CpuModelOps>(model.config()));

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
  std::map<int, GeneratedSample> actual = generate(*gpu_first, *gpu_second);
  ASSERT_EQ(actual.size(), expected.size());
  for (auto& [id, sample] : expected) {
    SCOPED_TRACE(id);
    EXPECT_EQ(actual[id].tokens, sample.tokens);
    EXPECT_EQ(actual[id].routes, sample.routes);
    ::tandem::cuda::ExpectAllNear(actual[id].logprobs, sample.logprobs, 1e-4f, 1e-4f);
  }
}

double MeanAbsoluteDifference(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += std::abs(double{a[i]} - b[i]);
  return sum / a.size();
}

// The logits at the last position of each of three prompts (of 5, 8 and 11 tokens), prefilled
// together: [prompts, vocab].
std::vector<float> PrefillLogits(DecodeEngine& engine) {
  const int vocab = engine.config().vocab_size;
  std::vector<std::vector<int>> prompts;
  std::vector<std::unique_ptr<SequenceCache>> caches;
  std::vector<PromptToPrefill> batch;
  for (int p = 0; p < 3; ++p) {
    std::vector<int>& prompt = prompts.emplace_back(5 + 3 * p);
    for (size_t t = 0; t < prompt.size(); ++t) prompt[t] = (7 * p + 3 * t + 1) % vocab;
  }
  for (const std::vector<int>& prompt : prompts) {
    absl::StatusOr<std::unique_ptr<SequenceCache>> cache = engine.NewCache(prompt.size());
    EXPECT_TRUE(cache.ok()) << cache.status();
    if (!cache.ok()) return {};
    caches.push_back(*std::move(cache));
    batch.push_back({prompt.data(), static_cast<int>(prompt.size()), caches.back().get()});
  }
  std::vector<float> logits(prompts.size() * vocab);
  const absl::Status status = engine.Prefill(batch, logits.data(), nullptr);
  EXPECT_TRUE(status.ok()) << status;
  return logits;
}

// The bf16 inference mode rounds activations where the CPU Transformer does: the GPU's bf16
// logits stay far closer to the CPU's bf16 logits than bf16 is to fp32 (a rounding left out
// would pull them toward fp32). Bit equality is out of reach: float sums in another order
// land a few values on the other side of a bf16 rounding boundary.
TEST_P(DeviceEnginesTest, Bf16ModeRoundsLikeTheCpu) {
  const ModelConfig config = GetParam().make();
  BaseModel model = test_models::RandomModel(config, 51).ForPrecision(Precision::kBF16);
  absl::StatusOr<LoraAdapter> lora = LoraAdapter::Create(config, test_models::TestLora(config), 52);
  ASSERT_TRUE(lora.ok());
  test_models::RandomizeLora(*lora, 53);
  LoraAdapter rounded = lora->RoundedToBf16();
  Transformer cpu_bf16(model, &rounded, std::make_unique<CpuModelOps>(model.config()),
                       Precision::kBF16);
  Transformer cpu_fp32(model, &rounded, std::make_unique<CpuModelOps>(model.config()));
  DecodeEngineMaker maker = GpuDecodeEngines(Precision::kBF16);
  std::unique_ptr<DecodeEngine> gpu = GpuDecodeEngine(maker, model, &rounded);
  ASSERT_NE(gpu, nullptr);
  const std::vector<float> expected = PrefillLogits(cpu_bf16);
  const double rounding_effect = MeanAbsoluteDifference(expected, PrefillLogits(cpu_fp32));
  ASSERT_GT(rounding_effect, 0);
  EXPECT_LT(MeanAbsoluteDifference(PrefillLogits(*gpu), expected), 0.1 * rounding_effect);
}

TEST_F(DeviceEnginesGpuTest, BackwardNeedsAForward) {
  const ModelConfig config = test_models::TinyConfig();
  BaseModel model = test_models::RandomModel(config, 26);
  absl::StatusOr<LoraAdapter> lora = LoraAdapter::Create(config, LoraConfig{}, 27);
  ASSERT_TRUE(lora.ok());
  lora->parameters().EnableGradients();
  std::unique_ptr<TrainingEngine> gpu = GpuPolicy(model, *lora);
  ASSERT_NE(gpu, nullptr);
  const std::vector<float> dlogits(int64_t{12} * config.vocab_size, 1.0f);
  EXPECT_EQ(gpu->Backward(dlogits.data(), nullptr).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(gpu->Forward(test_models::TwoSequences(), nullptr).ok());
  EXPECT_TRUE(gpu->Backward(dlogits.data(), nullptr).ok());
}

TEST_F(DeviceEnginesGpuTest, RefreshedAdapterChangesTheGpuForwardLikeTheCpus) {
  const ModelConfig config = test_models::TinyConfig();
  BaseModel model = test_models::RandomModel(config, 11);
  absl::StatusOr<LoraAdapter> lora = LoraAdapter::Create(config, LoraConfig{}, 12);
  ASSERT_TRUE(lora.ok());
  std::unique_ptr<TrainingEngine> gpu = GpuPolicy(model, *lora);
  ASSERT_NE(gpu, nullptr);
  test_models::RandomizeLora(*lora, 13);  // B was zero: the adapter now changes the output.
  ASSERT_TRUE(gpu->AdapterChanged().ok());
  Transformer cpu(model, &*lora, std::make_unique<CpuModelOps>(model.config()));
  const TokenBatch batch = test_models::TwoSequences();
  const int64_t size = int64_t{batch.num_tokens()} * config.vocab_size;
  absl::StatusOr<const float*> expected = cpu.Forward(batch);
  absl::StatusOr<const float*> actual = gpu->Forward(batch, nullptr);
  ASSERT_TRUE(expected.ok() && actual.ok());
  ::tandem::cuda::ExpectAllNear(std::vector<float>(*actual, *actual + size),
                                std::vector<float>(*expected, *expected + size), 1e-4f, 1e-4f);
}

TEST_F(DeviceEnginesGpuTest, BadInputIsRejectedAsOnTheCpu) {
  const ModelConfig config = test_models::TinyConfig();
  BaseModel model = test_models::RandomModel(config, 14);
  absl::StatusOr<LoraAdapter> lora = LoraAdapter::Create(config, LoraConfig{}, 15);
  ASSERT_TRUE(lora.ok());
  std::unique_ptr<TrainingEngine> policy = GpuPolicy(model, *lora);
  ASSERT_NE(policy, nullptr);
  TokenBatch batch;
  batch.Add({1, 2, 99});
  EXPECT_EQ(policy->Forward(batch, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  const TokenBatch good = test_models::TwoSequences();
  const std::vector<int16_t> short_replay(3, 0);
  EXPECT_EQ(policy->Forward(good, &short_replay).status().code(),
            absl::StatusCode::kInvalidArgument);
  DecodeEngineMaker maker = GpuDecodeEngines();
  std::unique_ptr<DecodeEngine> gpu = GpuDecodeEngine(maker, model, nullptr);
  ASSERT_NE(gpu, nullptr);
  // Caches hold 1..max_seq_len positions; a prompt or a decode position must fit its cache.
  EXPECT_EQ(gpu->NewCache(config.max_seq_len + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::unique_ptr<SequenceCache>> cache = gpu->NewCache(2);
  ASSERT_TRUE(cache.ok()) << cache.status();
  const std::vector<int> prompt = {1, 2, 3};
  std::vector<float> logits(3 * config.vocab_size);
  std::vector<int16_t> routes(3 * config.num_moe_layers() * config.top_k);
  EXPECT_EQ(gpu->Prefill({{.tokens = prompt.data(), .length = 3, .cache = cache->get()}},
                         logits.data(), routes.data())
                .code(),
            absl::StatusCode::kInvalidArgument);
  const int position = 2;
  EXPECT_EQ(
      gpu->Decode(prompt.data(), &position, {cache->get()}, logits.data(), routes.data()).code(),
      absl::StatusCode::kInvalidArgument);
}

// Runs everywhere: the engines are made where a GPU is visible, and refused saying why where none
// is; a GPU's first pass refuses what the CUDA backend cannot compute, by name.
TEST(DeviceEnginesCreateTest, GpuEnginesNeedAGpu) {
  const ModelConfig config = test_models::TinyConfig();
  BaseModel model = test_models::RandomModel(config, 15);
  LoraAdapter lora = *LoraAdapter::Create(config, LoraConfig{}, 16);
  const absl::StatusCode expected = ::tandem::cuda::VisibleDeviceCount() > 0
                                        ? absl::StatusCode::kOk
                                        : absl::StatusCode::kFailedPrecondition;
  EXPECT_EQ(MakeTrainingEngines("cuda:0", model, lora).status().code(), expected);
  absl::StatusOr<DecodeEngineMaker> maker = MakeDecodeEngineMaker("cuda:0", Precision::kBF16);
  ASSERT_TRUE(maker.ok()) << maker.status();  // Nothing is uploaded before the first engine.
  EXPECT_EQ((*maker)(model, nullptr).status().code(), expected);
  EXPECT_EQ(MakeDecodeEngineMaker("cuda:0", Precision::kFP8).status().code(),
            absl::StatusCode::kUnimplemented);
}

TEST_F(DeviceEnginesGpuTest, LatentAttentionIsRefusedByName) {
  const ModelConfig config = test_models::DeepseekV3ShapedConfig();
  BaseModel model = test_models::RandomModel(config, 16);
  LoraAdapter lora = *LoraAdapter::Create(config, test_models::TestLora(config), 17);
  std::unique_ptr<TrainingEngine> gpu = GpuPolicy(model, lora);
  ASSERT_NE(gpu, nullptr);
  const absl::Status status = gpu->Forward(test_models::TwoSequences(), nullptr).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), ::testing::HasSubstr("latent attention"));
}

}  // namespace
}  // namespace tandem::engine
