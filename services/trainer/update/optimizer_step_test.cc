#include "services/trainer/update/optimizer_step.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::trainer {
namespace {

struct OneTensor {
  std::vector<float> value = {1.0f, 1.0f};
  std::vector<float> grad = {3.0f, 4.0f};  // Norm 5.
  engine::AdamW optimizer = *engine::AdamW::Create(
      {}, {{.name = "w", .value = value.data(), .grad = grad.data(), .size = 2}});
};

TEST(ClipAndStepTest, ClipsToTheGlobalNormAndStepsAtTheSchedulesRate) {
  OneTensor tensor;
  const OptimizerSettings settings = {
      .schedule = {.peak_lr = 0.1f, .warmup_steps = 2, .total_steps = 10}, .max_grad_norm = 1.0f};
  // The norm over every rank is 10: this rank's gradients scale by 1 / 10, not 1 / 5.
  absl::StatusOr<OptimizerStep> step = ClipAndStep(tensor.optimizer, settings, 10.0);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_TRUE(step->stepped);
  EXPECT_DOUBLE_EQ(step->grad_norm, 10.0);
  EXPECT_NEAR(tensor.grad[0], 0.3f, 1e-6);
  EXPECT_FLOAT_EQ(step->learning_rate, 0.05f) << "the first of two warmup steps";
  EXPECT_EQ(tensor.optimizer.step(), 1);
  EXPECT_LT(tensor.value[0], 1.0f);
}

TEST(ClipAndStepTest, ANonFiniteNormSkipsTheStep) {
  OneTensor tensor;
  absl::StatusOr<OptimizerStep> step =
      ClipAndStep(tensor.optimizer, {}, std::numeric_limits<double>::quiet_NaN());
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_FALSE(step->stepped);
  EXPECT_TRUE(std::isnan(step->grad_norm));
  EXPECT_EQ(step->learning_rate, 0);
  EXPECT_EQ(tensor.optimizer.step(), 0);
  EXPECT_EQ(tensor.value[0], 1.0f);
}

}  // namespace
}  // namespace tandem::trainer
