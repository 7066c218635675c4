#include "services/trainer/step/step_metrics.h"

#include "gtest/gtest.h"

namespace tandem::trainer {
namespace {

StepSamples SamplesOf(int count, int correct, int response_length) {
  StepSamples samples;
  for (int i = 0; i < count; ++i) {
    samples.training.emplace_back().response.assign(response_length, 1);
  }
  samples.correct = correct;
  samples.reward = correct;
  samples.length = count * response_length;
  samples.truncated = 1;
  return samples;
}

// Two ranks' shares of a step: the step's means are over all samples, each rank's share is its
// own, and the missing-route share is over all route entries.
TEST(StepMetricsTest, RanksTalliesAddUpToTheStepsSampleMetrics) {
  std::vector<float> tallies = TalliesOf(SamplesOf(4, 3, 2), /*missing=*/0, /*entries=*/40);
  const std::vector<float> second = TalliesOf(SamplesOf(4, 1, 6), 10, 40);
  tallies.insert(tallies.end(), second.begin(), second.end());
  trainer::v1::StepMetrics metrics;
  SetSampleMetrics(tallies, metrics);
  EXPECT_DOUBLE_EQ(metrics.accuracy(), 0.5);
  EXPECT_DOUBLE_EQ(metrics.reward_mean(), 0.5);
  EXPECT_DOUBLE_EQ(metrics.response_length_mean(), 4.0);
  EXPECT_DOUBLE_EQ(metrics.truncated_share(), 0.25);
  EXPECT_DOUBLE_EQ(metrics.missing_route_share(), 0.125);
  ASSERT_EQ(metrics.ranks_size(), 2);
  EXPECT_EQ(metrics.ranks(1).rank(), 1);
  EXPECT_EQ(metrics.ranks(1).samples(), 4);
  EXPECT_EQ(metrics.ranks(1).response_tokens(), 24);
}

TEST(StepMetricsTest, AStepWithoutSamplesOrRoutesHasZeroMeans) {
  trainer::v1::StepMetrics metrics;
  SetSampleMetrics(TalliesOf(StepSamples{}, 0, 0), metrics);
  EXPECT_EQ(metrics.accuracy(), 0);
  EXPECT_EQ(metrics.missing_route_share(), 0);
  EXPECT_EQ(metrics.ranks_size(), 1);
}

TEST(StepMetricsTest, UpdateStatisticsBecomeTheTrainingMetrics) {
  UpdateStats stats;
  stats.loss = 0.25;
  stats.grad_norm = 1.5;
  stats.learning_rate = 0.005;
  stats.mismatch_kl_k3 = 2e-5;
  stats.response_tokens = 640;
  trainer::v1::StepMetrics metrics;
  SetUpdateMetrics(stats, metrics);
  EXPECT_DOUBLE_EQ(metrics.loss(), 0.25);
  EXPECT_DOUBLE_EQ(metrics.grad_norm(), 1.5);
  EXPECT_DOUBLE_EQ(metrics.learning_rate(), 0.005);
  EXPECT_DOUBLE_EQ(metrics.mismatch_kl_k3(), 2e-5);
  EXPECT_EQ(metrics.response_tokens(), 640);
}

}  // namespace
}  // namespace tandem::trainer
