#include "engine/sft.h"

#include <vector>

#include "gtest/gtest.h"

namespace tandem::engine {
namespace {

TEST(SftTest, LossDecreasesOnTheAdditionTask) {
  ModelConfig config = DefaultModelConfig();
  config.d_model = 32;
  config.num_layers = 2;
  config.expert_ffn_dim = 32;
  config.dense_ffn_dim = 64;
  BaseModel model = *BaseModel::Create(config, 1);
  auto task = MakeTask("addition", 1);
  ASSERT_TRUE(task.ok());
  SftConfig sft;
  sft.max_steps = 150;
  sft.eval_every = 50;
  sft.eval_prompts = 20;
  sft.stop_accuracy = 2;  // Never stop early.
  std::vector<double> losses;
  auto result = TrainSupervised(
      model, **task, sft, [&](const SftProgress& progress) { losses.push_back(progress.loss); });
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(losses.size(), 3u);
  EXPECT_LT(losses[2], losses[0] * 0.8) << losses[0] << " -> " << losses[2];
}

TEST(SftTest, BadConfigIsRejected) {
  BaseModel model = *BaseModel::Create(DefaultModelConfig(), 1);
  auto task = MakeTask("addition", 1);
  SftConfig sft;
  sft.batch_size = 0;
  EXPECT_EQ(TrainSupervised(model, **task, sft, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::engine
