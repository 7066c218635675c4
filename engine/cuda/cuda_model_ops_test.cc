// The one model graph over the CUDA backend against the same graph over the CPU backend: forward
// (live and replayed routes), backward into the adapter, prefill and decode, with an adapter in
// each expert layout; and what the CUDA backend refuses, by operation. Skips without a GPU, except
// the test that Create needs one.
#include "engine/cuda/cuda_model_ops.h"

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/cpu_model_ops.h"
#include "engine/testing/test_models.h"
#include "engine/transformer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/testing.h"

namespace tandem::engine::cuda {
namespace {

using test_models::NamedConfig;
using ::testing::HasSubstr;

class CudaModelOpsTest : public ::tandem::cuda::CudaTest,
                         public ::testing::WithParamInterface<NamedConfig> {};
class CudaModelOpsGpuTest : public ::tandem::cuda::CudaTest {};

INSTANTIATE_TEST_SUITE_P(Shapes, CudaModelOpsTest,
                         ::testing::ValuesIn(test_models::StandardAttentionConfigs()),
                         [](const auto& info) { return std::string(info.param.name); });

// A Transformer over the CUDA backend on GPU 0, with its own device copy of the base model.
std::unique_ptr<Transformer> GpuTransformer(BaseModel& model, LoraAdapter* lora,
                                            Precision precision = Precision::kF32) {
  absl::StatusOr<DeviceParameters> base = DeviceParameters::Upload(model.parameters());
  EXPECT_TRUE(base.ok()) << base.status();
  if (!base.ok()) return nullptr;
  absl::StatusOr<std::unique_ptr<CudaModelOps>> ops = CudaModelOps::Create(
      model.config(), 0, model, std::make_shared<DeviceParameters>(*std::move(base)), lora);
  EXPECT_TRUE(ops.ok()) << ops.status();
  if (!ops.ok()) return nullptr;
  return std::make_unique<Transformer>(model, lora, *std::move(ops), precision);
}

std::vector<float> Logits(Transformer& transformer, const TokenBatch& batch,
                          const std::vector<int16_t>* replay = nullptr) {
  absl::StatusOr<const float*> logits = transformer.Forward(batch, replay);
  EXPECT_TRUE(logits.ok()) << logits.status();
  if (!logits.ok()) return {};
  return std::vector<float>(*logits,
                            *logits + batch.num_tokens() * transformer.config().vocab_size);
}

TEST_P(CudaModelOpsTest, TheGraphOnTheGpuComputesWhatItComputesOnTheCpu) {
  const ModelConfig config = GetParam().make();
  BaseModel model = test_models::RandomModel(config, 7);
  for (const ExpertLayout layout :
       {ExpertLayout::kPerExpert, ExpertLayout::kShared, ExpertLayout::kSharedOuter}) {
    SCOPED_TRACE(ExpertLayoutName(layout));
    LoraConfig lora_config = test_models::TestLora(config);
    lora_config.expert_layout = layout;
    LoraAdapter lora = *LoraAdapter::Create(config, lora_config, 8);
    test_models::RandomizeLora(lora, 9);
    lora.parameters().EnableGradients();
    Transformer cpu(model, &lora, std::make_unique<CpuModelOps>(model.config()));
    std::unique_ptr<Transformer> gpu = GpuTransformer(model, &lora);
    ASSERT_NE(gpu, nullptr);
    const TokenBatch batch = test_models::TwoSequences();

    // Groups of more than one 64-row tile: hundreds of routed rows per expert.
    TokenBatch large;
    for (int s = 0; s < 8; ++s) {
      std::vector<int> sequence(std::min(config.max_seq_len, 48));
      for (size_t t = 0; t < sequence.size(); ++t)
        sequence[t] = (7 * s + 3 * t) % config.vocab_size;
      large.Add(sequence);
    }
    ::tandem::cuda::ExpectAllNear(Logits(*gpu, large), Logits(cpu, large), 1e-4f, 1e-4f);

    const std::vector<float> cpu_logits = Logits(cpu, batch);
    ::tandem::cuda::ExpectAllNear(Logits(*gpu, batch), cpu_logits, 1e-4f, 1e-4f);
    EXPECT_EQ(gpu->routes(), cpu.routes());  // fp32 both: the same routing decisions.

    std::mt19937_64 rng(4);
    std::normal_distribution<float> normal;
    std::vector<float> dlogits(cpu_logits.size());
    for (float& value : dlogits) value = normal(rng);
    ASSERT_TRUE(cpu.Backward(dlogits.data()).ok());
    const std::vector<float> cpu_gradients = test_models::Gradients(lora.parameters());
    lora.parameters().ZeroGradients();
    ASSERT_TRUE(gpu->Forward(batch).ok());
    ASSERT_TRUE(gpu->Backward(dlogits.data()).ok());
    ::tandem::cuda::ExpectAllNear(test_models::Gradients(lora.parameters()), cpu_gradients, 1e-3f,
                                  1e-3f);
    lora.parameters().ZeroGradients();

    std::vector<int16_t> replay = cpu.routes();
    std::reverse(replay.begin(), replay.end());
    for (size_t row = 0; row < replay.size() / config.top_k; ++row) {
      std::sort(replay.begin() + row * config.top_k, replay.begin() + (row + 1) * config.top_k);
    }
    ::tandem::cuda::ExpectAllNear(Logits(*gpu, batch, &replay), Logits(cpu, batch, &replay), 1e-4f,
                                  1e-4f);

    // Prefill one prompt, then decode two tokens.
    const std::vector<int> prompt = {1, 5, 9, 2};
    std::vector<float> cpu_last(config.vocab_size), gpu_last(config.vocab_size);
    std::unique_ptr<SequenceCache> cpu_cache = *cpu.NewCache(8);
    std::unique_ptr<SequenceCache> gpu_cache = *gpu->NewCache(8);
    ASSERT_TRUE(cpu.Prefill({{prompt.data(), 4, cpu_cache.get()}}, cpu_last.data(), nullptr).ok());
    ASSERT_TRUE(gpu->Prefill({{prompt.data(), 4, gpu_cache.get()}}, gpu_last.data(), nullptr).ok());
    ::tandem::cuda::ExpectAllNear(gpu_last, cpu_last, 1e-4f, 1e-4f);
    for (int position = 4; position < 6; ++position) {
      const int token = position % 7;
      ASSERT_TRUE(cpu.Decode(&token, &position, {cpu_cache.get()}, cpu_last.data(), nullptr).ok());
      ASSERT_TRUE(gpu->Decode(&token, &position, {gpu_cache.get()}, gpu_last.data(), nullptr).ok());
      ::tandem::cuda::ExpectAllNear(gpu_last, cpu_last, 1e-4f, 1e-4f);
    }
  }
}

TEST_F(CudaModelOpsGpuTest, WhatTheCudaBackendCannotDoIsRefusedByOperation) {
  BaseModel model = test_models::RandomModel(test_models::TinyConfig(), 3);
  BaseModel fp8 = model.ForPrecision(Precision::kFP8);
  std::unique_ptr<Transformer> gpu = GpuTransformer(fp8, nullptr, Precision::kFP8);
  ASSERT_NE(gpu, nullptr);
  absl::Status status = gpu->Forward(test_models::TwoSequences()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), HasSubstr("QuantizeRowsToE4M3"));

  BaseModel latent = test_models::RandomModel(test_models::DeepseekV3ShapedConfig(), 4);
  gpu = GpuTransformer(latent, nullptr);
  ASSERT_NE(gpu, nullptr);
  status = gpu->Forward(test_models::TwoSequences()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), HasSubstr("latent attention"));

  // Gradients of the base model (full fine-tuning) stay on the CPU.
  model.parameters().EnableGradients();
  gpu = GpuTransformer(model, nullptr);
  ASSERT_NE(gpu, nullptr);
  ASSERT_TRUE(gpu->Forward(test_models::TwoSequences()).ok());
  const std::vector<float> dlogits(int64_t{12} * model.config().vocab_size, 1.0f);
  status = gpu->Backward(dlogits.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), HasSubstr("frozen on this backend"));
}

// Runs everywhere.
TEST(CudaModelOpsCreateTest, NeedsAGpu) {
  if (::tandem::cuda::VisibleDeviceCount() > 0) GTEST_SKIP() << "a GPU is visible";
  BaseModel model = test_models::RandomModel(test_models::TinyConfig(), 5);
  EXPECT_FALSE(
      CudaModelOps::Create(model.config(), 0, model, std::make_shared<DeviceParameters>(), nullptr)
          .ok());
}

}  // namespace
}  // namespace tandem::engine::cuda
