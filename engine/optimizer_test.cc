#include "engine/optimizer.h"

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::engine {
namespace {

using ::testing::HasSubstr;

// Values, gradients and a Param view over them.
struct Tensor {
  std::vector<float> value;
  std::vector<float> grad;

  Param View(const std::string& name, bool decay = true) {
    return {name, value.data(), grad.data(), static_cast<int64_t>(value.size()), decay};
  }
};

AdamW MustCreate(const AdamWConfig& config, std::vector<Param> params) {
  absl::StatusOr<AdamW> optimizer = AdamW::Create(config, std::move(params));
  EXPECT_TRUE(optimizer.ok()) << optimizer.status();
  return *std::move(optimizer);
}

constexpr AdamWConfig kConfig = {
    .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f};

TEST(AdamWTest, TwoStepsMatchHandComputedValues) {
  Tensor decayed{{1.0f}, {0.5f}};
  Tensor plain{{-2.0f}, {-1.0f}};
  AdamW optimizer = MustCreate(kConfig, {decayed.View("a"), plain.View("b", false)});
  ASSERT_TRUE(optimizer.Step(0.1f).ok());
  // a: 1 * (1 - 0.1 * 0.1) - 0.1 * m_hat / (sqrt(v_hat) + eps) with m_hat = 0.5, v_hat = 0.25.
  EXPECT_NEAR(decayed.value[0], 0.89f, 1e-6);
  EXPECT_NEAR(plain.value[0], -1.9f, 1e-6);
  decayed.grad[0] = 0.25f;
  plain.grad[0] = 2.0f;
  ASSERT_TRUE(optimizer.Step(0.1f).ok());
  EXPECT_NEAR(decayed.value[0], 0.78788204f, 1e-6);
  EXPECT_NEAR(plain.value[0], -1.93661035f, 1e-6);
  EXPECT_EQ(optimizer.step(), 2);
}

TEST(AdamWTest, WeightDecayIsDecoupledFromTheAdaptiveUpdate) {
  // With a zero gradient the Adam term is exactly zero, so only the decay p *= 1 - lr * wd acts;
  // L2-in-the-gradient Adam would instead move p by about lr, whatever its size.
  Tensor decayed{{4.0f, -0.001f}, {0.0f, 0.0f}};
  Tensor frozen{{4.0f}, {0.0f}};
  AdamW optimizer = MustCreate(kConfig, {decayed.View("a"), frozen.View("norm", false)});
  ASSERT_TRUE(optimizer.Step(0.5f).ok());
  EXPECT_FLOAT_EQ(decayed.value[0], 4.0f * 0.95f);
  EXPECT_FLOAT_EQ(decayed.value[1], -0.001f * 0.95f);
  EXPECT_EQ(frozen.value[0], 4.0f);
}

TEST(AdamWTest, DecayScalesWithValueWhileAdamStepDoesNot) {
  Tensor small{{1.0f}, {0.3f}};
  Tensor large{{10.0f}, {0.3f}};
  AdamW optimizer = MustCreate(kConfig, {small.View("small"), large.View("large")});
  ASSERT_TRUE(optimizer.Step(0.01f).ok());
  // The same gradient gives the same Adam step (lr); the decay part is lr * wd * p.
  EXPECT_NEAR(1.0f - small.value[0], 0.01f + 0.01f * 0.1f * 1.0f, 1e-6);
  EXPECT_NEAR(10.0f - large.value[0], 0.01f + 0.01f * 0.1f * 10.0f, 1e-5);
}

TEST(AdamWTest, ExportImportContinuesBitExactly) {
  Tensor a{{0.3f, -0.7f, 1.2f}, {0.0f, 0.0f, 0.0f}};
  Tensor b{{2.0f}, {0.0f}};
  AdamW original = MustCreate(kConfig, {a.View("a"), b.View("b", false)});
  auto set_grads = [](Tensor& t, int step) {
    for (size_t i = 0; i < t.grad.size(); ++i) t.grad[i] = std::sin(1.0f + step * 3.0f + i);
  };
  for (int step = 0; step < 3; ++step) {
    set_grads(a, step);
    set_grads(b, step);
    ASSERT_TRUE(original.Step(0.05f).ok());
  }
  Tensor a_copy = a;
  Tensor b_copy = b;
  AdamW restored = MustCreate(kConfig, {a_copy.View("a"), b_copy.View("b", false)});
  const AdamWState state = original.ExportState();
  EXPECT_EQ(state.step, 3);
  EXPECT_EQ(state.tensors.size(), 4u);
  EXPECT_EQ(state.tensors.at("a.exp_avg_sq").size(), 3u);
  ASSERT_TRUE(restored.ImportState(state).ok());
  EXPECT_EQ(restored.step(), 3);
  for (int step = 3; step < 6; ++step) {
    for (Tensor* t : {&a, &b, &a_copy, &b_copy}) set_grads(*t, step);
    ASSERT_TRUE(original.Step(0.05f).ok());
    ASSERT_TRUE(restored.Step(0.05f).ok());
    EXPECT_EQ(a.value, a_copy.value);
    EXPECT_EQ(b.value, b_copy.value);
  }
}

TEST(AdamWTest, ImportRejectsMismatchedStateAndKeepsItsOwn) {
  Tensor a{{1.0f, 2.0f}, {1.0f, 1.0f}};
  AdamW optimizer = MustCreate(kConfig, {a.View("a")});
  ASSERT_TRUE(optimizer.Step(0.1f).ok());
  const AdamWState good = optimizer.ExportState();

  AdamWState missing = good;
  missing.tensors.erase("a.exp_avg_sq");
  AdamWState wrong_size = good;
  wrong_size.tensors["a.exp_avg"].push_back(0.0f);
  AdamWState unknown = good;
  unknown.tensors["b.exp_avg"] = {0.0f};
  AdamWState negative_step = good;
  negative_step.step = -1;
  struct Case {
    const AdamWState* state;
    const char* message;
  };
  for (const Case& c :
       {Case{&missing, "lacks tensor \"a.exp_avg_sq\""},
        Case{&wrong_size, "\"a.exp_avg\" has 3 elements, expected 2"},
        Case{&unknown, "unknown tensor \"b.exp_avg\""}, Case{&negative_step, "step = -1"}}) {
    const absl::Status status = optimizer.ImportState(*c.state);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
  EXPECT_EQ(optimizer.step(), 1);
  EXPECT_EQ(optimizer.ExportState().tensors, good.tensors);
}

// Tensors whose memory moved: after Rebind the optimizer updates them where they are now,
// continuing from the same moments as if they had never moved.
TEST(AdamWTest, RebindFollowsMovedTensorsAndRefusesOthers) {
  Tensor a{{1.0f, 2.0f}, {1.0f, 1.0f}}, unmoved{{1.0f, 2.0f}, {1.0f, 1.0f}};
  AdamW optimizer = MustCreate(kConfig, {a.View("a")});
  AdamW reference = MustCreate(kConfig, {unmoved.View("a")});
  ASSERT_TRUE(optimizer.Step(0.1f).ok() && reference.Step(0.1f).ok());
  Tensor moved = a;
  ASSERT_TRUE(optimizer.Rebind({moved.View("a")}).ok());
  ASSERT_TRUE(optimizer.Step(0.1f).ok() && reference.Step(0.1f).ok());
  EXPECT_EQ(moved.value, unmoved.value);
  Tensor other{{1.0f}, {1.0f}};
  EXPECT_EQ(optimizer.Rebind({other.View("a")}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(optimizer.Rebind({moved.View("b")}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(AdamWTest, StepRejectsBadLearningRateWithoutChangingAnything) {
  Tensor a{{1.0f}, {1.0f}};
  AdamW optimizer = MustCreate(kConfig, {a.View("a")});
  for (const float lr :
       {-0.1f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    const absl::Status status = optimizer.Step(lr);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("learning rate = "));
  }
  EXPECT_EQ(optimizer.step(), 0);
  EXPECT_EQ(a.value[0], 1.0f);
}

TEST(AdamWTest, CreateRejectsBadConfigsAndParams) {
  Tensor a{{1.0f}, {1.0f}};
  struct Case {
    AdamWConfig config;
    std::vector<Param> params;
    const char* message;
  };
  const std::vector<Case> cases = {
      {{.beta1 = 1.0f}, {}, "beta1 = 1"},
      {{.beta2 = -0.1f}, {}, "beta2 = -0.1"},
      {{.eps = 0.0f}, {}, "eps = 0"},
      {{.weight_decay = -1.0f}, {}, "weight_decay = -1"},
      {{}, {a.View("")}, "empty name"},
      {{}, {a.View("x"), a.View("x")}, "\"x\" is listed twice"},
      {{}, {Param{"x", nullptr, nullptr, -1, true}}, "\"x\" has negative size -1"},
      {{}, {Param{"x", a.value.data(), nullptr, 1, true}}, "\"x\" has a null"},
  };
  for (const Case& c : cases) {
    const absl::Status status = AdamW::Create(c.config, c.params).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
  EXPECT_TRUE(AdamW::Create({}, {Param{"empty", nullptr, nullptr, 0, true}}).ok());
}

TEST(ClipGradNormTest, ScalesToMaxNormAndReturnsThePreClipNorm) {
  Tensor a{{0.0f, 0.0f}, {3.0f, 4.0f}};
  Tensor b{{0.0f}, {12.0f}};
  const std::vector<Param> params = {a.View("a"), b.View("b")};
  EXPECT_FLOAT_EQ(ClipGradNorm(params, 6.5f), 13.0f);
  EXPECT_NEAR(a.grad[0], 1.5f, 1e-6);
  EXPECT_NEAR(a.grad[1], 2.0f, 1e-6);
  EXPECT_NEAR(b.grad[0], 6.0f, 1e-6);
  EXPECT_NEAR(ClipGradNorm(params, 0.0f), 6.5f, 1e-5);
}

TEST(ClipGradNormTest, ClipsTheOptimizersParams) {
  Tensor a{{0.0f, 0.0f}, {3.0f, 4.0f}};
  AdamW optimizer = MustCreate(kConfig, {a.View("a")});
  EXPECT_FLOAT_EQ(ClipGradNorm(optimizer.params(), 1.0f), 5.0f);
  EXPECT_NEAR(a.grad[1], 0.8f, 1e-6);
}

TEST(ClipGradNormTest, LeavesGradientsAloneWhenUnderTheLimitOrOff) {
  Tensor a{{0.0f, 0.0f}, {3.0f, 4.0f}};
  const std::vector<Param> params = {a.View("a")};
  EXPECT_FLOAT_EQ(ClipGradNorm(params, 10.0f), 5.0f);
  EXPECT_FLOAT_EQ(ClipGradNorm(params, 0.0f), 5.0f);
  EXPECT_FLOAT_EQ(ClipGradNorm(params, -1.0f), 5.0f);
  EXPECT_EQ(a.grad, (std::vector<float>{3.0f, 4.0f}));
}

TEST(ClipGradNormTest, NonFiniteNormIsReturnedAndGradientsKept) {
  Tensor a{{0.0f, 0.0f}, {std::numeric_limits<float>::infinity(), 1.0f}};
  const std::vector<Param> params = {a.View("a")};
  EXPECT_TRUE(std::isinf(ClipGradNorm(params, 1.0f)));
  EXPECT_EQ(a.grad[1], 1.0f);
}

TEST(ScheduleTest, WarmupThenCosineToMinimum) {
  const ScheduleConfig config = {
      .peak_lr = 1.0f, .min_lr = 0.1f, .warmup_steps = 4, .total_steps = 14};
  ASSERT_TRUE(Validate(config).ok());
  EXPECT_FLOAT_EQ(LearningRate(config, -3), 0.25f);
  EXPECT_FLOAT_EQ(LearningRate(config, 0), 0.25f);
  EXPECT_FLOAT_EQ(LearningRate(config, 1), 0.5f);
  EXPECT_FLOAT_EQ(LearningRate(config, 3), 1.0f);
  EXPECT_FLOAT_EQ(LearningRate(config, 4), 1.0f);
  EXPECT_FLOAT_EQ(LearningRate(config, 9), 0.55f);  // Halfway: the midpoint of peak and min.
  EXPECT_FLOAT_EQ(LearningRate(config, 13), 0.12202457f);
  EXPECT_FLOAT_EQ(LearningRate(config, 14), 0.1f);
  EXPECT_FLOAT_EQ(LearningRate(config, 1000), 0.1f);
}

TEST(ScheduleTest, WarmupThenLinearToMinimum) {
  const ScheduleConfig config = {.peak_lr = 1.0f,
                                 .min_lr = 0.2f,
                                 .warmup_steps = 2,
                                 .total_steps = 10,
                                 .decay = LrDecay::kLinear};
  ASSERT_TRUE(Validate(config).ok());
  EXPECT_FLOAT_EQ(LearningRate(config, 0), 0.5f);
  EXPECT_FLOAT_EQ(LearningRate(config, 2), 1.0f);
  EXPECT_FLOAT_EQ(LearningRate(config, 4), 0.8f);  // A quarter of the way: 1 - 0.8 * 0.25.
  EXPECT_FLOAT_EQ(LearningRate(config, 6), 0.6f);
  EXPECT_FLOAT_EQ(LearningRate(config, 10), 0.2f);
}

TEST(ScheduleTest, ConstantKeepsThePeakAfterItsWarmup) {
  ScheduleConfig config = ScheduleConfig::Constant(0.3f);
  EXPECT_FLOAT_EQ(LearningRate(config, 0), 0.3f);
  EXPECT_FLOAT_EQ(LearningRate(config, 1000), 0.3f);
  config.warmup_steps = 3;
  config.total_steps = 10;
  EXPECT_FLOAT_EQ(LearningRate(config, 0), 0.1f);
  EXPECT_FLOAT_EQ(LearningRate(config, 5), 0.3f);
  EXPECT_FLOAT_EQ(LearningRate(config, 50), 0.3f);
}

TEST(ScheduleTest, NoWarmupStartsAtPeak) {
  const ScheduleConfig config = {
      .peak_lr = 2.0f, .min_lr = 0.0f, .warmup_steps = 0, .total_steps = 2};
  EXPECT_FLOAT_EQ(LearningRate(config, 0), 2.0f);
  EXPECT_FLOAT_EQ(LearningRate(config, 1), 1.0f);
  EXPECT_FLOAT_EQ(LearningRate(config, 2), 0.0f);
}

TEST(ScheduleTest, WarmupOverTheWholeRunEndsAtMinimum) {
  const ScheduleConfig config = {
      .peak_lr = 1.0f, .min_lr = 0.5f, .warmup_steps = 2, .total_steps = 2};
  EXPECT_FLOAT_EQ(LearningRate(config, 0), 0.5f);
  EXPECT_FLOAT_EQ(LearningRate(config, 1), 1.0f);
  EXPECT_FLOAT_EQ(LearningRate(config, 2), 0.5f);
}

TEST(ScheduleTest, ValidateNamesFieldAndValue) {
  struct Case {
    ScheduleConfig config;
    const char* message;
  };
  for (const Case& c : {Case{{.peak_lr = 0.0f}, "peak_lr = 0"},
                        Case{{.peak_lr = 1.0f, .min_lr = 2.0f}, "min_lr = 2"},
                        Case{{.peak_lr = 1.0f, .min_lr = -1.0f}, "min_lr = -1"},
                        Case{{.total_steps = 0}, "total_steps = 0"},
                        Case{{.warmup_steps = -1, .total_steps = 5}, "warmup_steps = -1"},
                        Case{{.warmup_steps = 6, .total_steps = 5}, "warmup_steps = 6"}}) {
    const absl::Status status = Validate(c.config);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace tandem::engine
