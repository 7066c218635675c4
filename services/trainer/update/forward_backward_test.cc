#include "services/trainer/update/forward_backward.h"

#include <memory>
#include <string>
#include <vector>

#include "engine/cpu_model_ops.h"
#include "engine/testing/test_models.h"
#include "engine/training_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::trainer {
namespace {

using ::testing::HasSubstr;

class ForwardBackwardTest : public ::testing::Test {
 protected:
  ForwardBackwardTest()
      : model_(engine::test_models::RandomModel(engine::test_models::TinyConfig(), 1)),
        lora_(*engine::LoraAdapter::Create(model_.config(),
                                           engine::test_models::TestLora(model_.config()), 2)) {
    engine::test_models::RandomizeLora(lora_, 3);
    lora_.parameters().EnableGradients();
    sequences_.Add({1, 2, 3, 4, 5});
    sequences_.Add({6, 7, 8});
    targets_ = {2, 3, -1, 5, -1, 7, 8, -1};
  }

  engine::TransformerTrainingEngine Engine() {
    return engine::TransformerTrainingEngine(
        model_, &lora_, std::make_unique<engine::CpuModelOps>(model_.config()), nullptr);
  }
  std::vector<float> Gradients() {
    std::vector<float> all = engine::test_models::Gradients(lora_.parameters());
    lora_.parameters().ZeroGradients();
    return all;
  }

  engine::BaseModel model_;
  engine::LoraAdapter lora_;
  engine::TokenBatch sequences_;
  std::vector<int> targets_;
};

// The loss -sum(log p) through ForwardBackward: its value, and the gradients a forward and a
// backward of the engine by hand give.
TEST_F(ForwardBackwardTest, TheLossAndItsGradientsAreTheEnginesOwn) {
  engine::TransformerTrainingEngine engine = Engine();
  absl::StatusOr<std::vector<float>> logp =
      engine.ForwardLogProbs(sequences_, nullptr, targets_, 0.9f);
  ASSERT_TRUE(logp.ok()) << logp.status();
  const std::vector<float> minus_one(logp->size(), -1.0f);
  ASSERT_TRUE(engine.BackwardLogProbs(minus_one.data(), nullptr).ok());
  const std::vector<float> expected = Gradients();
  double expected_loss = 0;
  for (float value : *logp) expected_loss -= value;

  const absl::StatusOr<double> loss =
      ForwardBackward(engine, {&sequences_, &targets_, nullptr, 0.9f},
                      [](const std::vector<float>& rows) -> absl::StatusOr<TokenLoss> {
                        TokenLoss loss{.dlogp = std::vector<float>(rows.size(), -1.0f)};
                        for (float value : rows) loss.value -= value;
                        return loss;
                      });
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_DOUBLE_EQ(*loss, expected_loss);
  EXPECT_EQ(Gradients(), expected);
}

// A loss whose gradient does not fit the forward, or that fails, ends the call with its status
// and nothing backpropagated.
TEST_F(ForwardBackwardTest, ALossThatFailsOrDoesNotFitIsRefused) {
  engine::TransformerTrainingEngine engine = Engine();
  const ScoredSequences batch{&sequences_, &targets_, nullptr, 1.0f};
  const absl::Status short_gradient =
      ForwardBackward(engine, batch, [](const std::vector<float>& rows) {
        return absl::StatusOr<TokenLoss>(TokenLoss{.dlogp = std::vector<float>(rows.size() - 1)});
      }).status();
  EXPECT_EQ(short_gradient.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(short_gradient.message(), HasSubstr("7 log-probs for 8 positions"));
  const absl::Status bad_hidden =
      ForwardBackward(engine, batch, [](const std::vector<float>& rows) {
        return absl::StatusOr<TokenLoss>(
            TokenLoss{.dlogp = std::vector<float>(rows.size()), .dhidden = {1.0f}});
      }).status();
  EXPECT_EQ(bad_hidden.code(), absl::StatusCode::kInvalidArgument);
  const absl::Status failed =
      ForwardBackward(engine, batch, [](const std::vector<float>&) {
        return absl::StatusOr<TokenLoss>(absl::FailedPreconditionError("no advantages"));
      }).status();
  EXPECT_EQ(failed.code(), absl::StatusCode::kFailedPrecondition);
  for (float g : Gradients()) ASSERT_EQ(g, 0.0f);
}

}  // namespace
}  // namespace tandem::trainer
