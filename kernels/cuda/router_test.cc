#include "kernels/cuda/router.h"

#include <tuple>

#include "kernels/cpu/router.h"
#include "kernels/cuda/testing.h"

namespace tandem::cuda {
namespace {

using kernels::ScoringFunction;

// Calls say cuda:: where a cpu:: argument type would also find the CPU twin by lookup.

struct RouterShape {
  int tokens;
  int experts;
  int k;
  kernels::GroupLimit limit;
  bool with_bias;
};

class RouterTest : public CudaTest, public ::testing::WithParamInterface<RouterShape> {};

// The demo model's router, an odd expert count, DeepSeek-V3's (256 experts, 8 of 8 groups kept
// 4, selection bias) and the largest k.
INSTANTIATE_TEST_SUITE_P(Shapes, RouterTest,
                         ::testing::Values(RouterShape{333, 8, 2, {}, false},
                                           RouterShape{101, 61, 5, {}, true},
                                           RouterShape{517, 256, 8, {8, 4}, true},
                                           RouterShape{40, 128, 64, {}, false}));

TEST_P(RouterTest, RoutesAreIdenticalAndGatesMatchTheCpu) {
  const RouterShape shape = GetParam();
  const int T = shape.tokens, E = shape.experts, k = shape.k;
  const size_t n = static_cast<size_t>(T) * E;
  const std::vector<float> logits = RandomFloats(n, 81, -4.0f, 4.0f);
  const std::vector<float> bias = RandomFloats(E, 82, -0.1f, 0.1f);
  const float* bias_host = shape.with_bias ? bias.data() : nullptr;
  DeviceArray<float> logits_d = Upload(logits), bias_d = Upload(bias);
  const float* bias_device = shape.with_bias ? bias_d.data() : nullptr;

  for (const ScoringFunction scoring : {ScoringFunction::kSoftmax, ScoringFunction::kSigmoid}) {
    for (const bool normalize : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "sigmoid=" << (scoring == ScoringFunction::kSigmoid)
                                        << " normalize=" << normalize);
      std::vector<float> scores(n);
      cpu::RouterScores(logits.data(), scores.data(), T, E, scoring);
      DeviceArray<float> scores_d = DeviceZeros<float>(n);
      ASSERT_TRUE(cuda::RouterScores(logits_d.data(), scores_d.data(), T, E, scoring).ok());
      ExpectAllNear(Download(scores_d), scores, 1e-7f, 2e-6f);

      // Selection from the same scores must agree bit for bit: it only adds and compares.
      std::vector<int16_t> ids(static_cast<size_t>(T) * k);
      cpu::TopK(scores.data(), bias_host, T, E, k, ids.data(), shape.limit);
      DeviceArray<float> cpu_scores_d = Upload(scores);
      DeviceArray<int16_t> ids_d = DeviceZeros<int16_t>(ids.size());
      ASSERT_TRUE(
          cuda::TopK(cpu_scores_d.data(), bias_device, T, E, k, ids_d.data(), shape.limit).ok());
      ASSERT_EQ(Download(ids_d), ids);

      std::vector<float> gates(ids.size());
      cpu::GateWeights(scores.data(), ids.data(), T, E, k, normalize, gates.data());
      DeviceArray<float> gates_d = DeviceZeros<float>(gates.size());
      ASSERT_TRUE(
          cuda::GateWeights(cpu_scores_d.data(), ids_d.data(), T, E, k, normalize, gates_d.data())
              .ok());
      ExpectAllNear(Download(gates_d), gates, 1e-7f, 1e-6f);

      const std::vector<float> dgates = RandomFloats(gates.size(), 83);
      std::vector<float> dlogits = RandomFloats(n, 84);
      DeviceArray<float> dgates_d = Upload(dgates), dlogits_d = Upload(dlogits);
      cpu::RouterGatesBackward(logits.data(), scores.data(), ids.data(), dgates.data(),
                               dlogits.data(), T, E, k, normalize, scoring);
      ASSERT_TRUE(cuda::RouterGatesBackward(logits_d.data(), cpu_scores_d.data(), ids_d.data(),
                                            dgates_d.data(), dlogits_d.data(), T, E, k, normalize,
                                            scoring)
                      .ok());
      ExpectAllNear(Download(dlogits_d), dlogits, 1e-6f, 1e-5f);
    }
  }
}

TEST_F(CudaTest, TopKRanksNanLastAndBreaksTiesByLowerId) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> scores = {0.5f, nan, 0.5f, 0.25f, 0.5f, -1.0f};
  DeviceArray<float> scores_d = Upload(scores);
  DeviceArray<int16_t> ids_d = DeviceZeros<int16_t>(6);
  ASSERT_TRUE(cuda::TopK(scores_d.data(), nullptr, 1, 6, 6, ids_d.data()).ok());
  EXPECT_EQ(Download(ids_d), (std::vector<int16_t>{0, 2, 4, 3, 5, 1}));
}

TEST_F(CudaTest, TopKRejectsShapesTheKernelCannotServe) {
  int16_t* no_ids = nullptr;
  EXPECT_EQ(cuda::TopK(nullptr, nullptr, 4, 8, 9, no_ids).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::TopK(nullptr, nullptr, 4, 128, 65, no_ids).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::TopK(nullptr, nullptr, 4, 256, 8, no_ids, {128, 4}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::TopK(nullptr, nullptr, 4, 60, 8, no_ids, {8, 4}).code(),
            absl::StatusCode::kInvalidArgument);  // 60 experts do not split into 8 groups.
  EXPECT_TRUE(cuda::TopK(nullptr, nullptr, 0, 8, 2, no_ids).ok());
}

}  // namespace
}  // namespace tandem::cuda
