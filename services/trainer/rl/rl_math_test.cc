// The RL math against hand-computed test vectors, and the policy-loss gradient against
// finite differences in every aggregation mode.
#include <cmath>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/trainer/rl/advantages.h"
#include "services/trainer/rl/mismatch_correction.h"
#include "services/trainer/rl/policy_loss.h"

namespace tandem::trainer {
namespace {

using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::Pointwise;

constexpr double kTolerance = 1e-5;

const std::vector<double> kRewards = {0, 0, 1, 0, 1, 0};
const std::vector<double> kValues = {.5, .6, .7, .2, .4, 9.9};
const std::vector<double> kMask = {1, 1, 1, 1, 1, 0};

TEST(AdvantagesTest, GaeMatchesTheReferenceVectors) {
  const GaeResult gae = ComputeGae(kRewards, kValues, kMask, 2, 3, 1.0, 0.95);
  EXPECT_THAT(gae.advantages, Pointwise(DoubleNear(kTolerance),
                                        std::vector<double>{0.46575, 0.385, 0.3, 0.77, 0.6, 0}));
  EXPECT_THAT(gae.returns, Pointwise(DoubleNear(kTolerance),
                                     std::vector<double>{0.96575, 0.985, 1.0, 0.97, 1.0, 9.9}));
  EXPECT_THAT(
      WhitenMasked(gae.advantages, kMask),
      Pointwise(DoubleNear(kTolerance), std::vector<double>{-0.207331, -0.643321, -1.102258,
                                                            1.435392, 0.517519, -2.722035}));
  const GaeResult discounted = ComputeGae(kRewards, kValues, kMask, 2, 3, 0.99, 0.95);
  EXPECT_THAT(discounted.advantages,
              Pointwise(DoubleNear(kTolerance),
                        std::vector<double>{0.446829, 0.37515, 0.3, 0.7603, 0.6, 0}));
}

TEST(AdvantagesTest, TruncatedGaeBootstrapsFromTheLastValue) {
  bool truncated[] = {false, true};
  const GaeResult gae =
      ComputeGae(kRewards, kValues, kMask, 2, 3, 1.0, 0.95, absl::MakeConstSpan(truncated, 2));
  // Row 0 is unchanged; row 1 starts from V(s_1) = 0.4: delta_1 = 1 + 0.4 - 0.4.
  EXPECT_NEAR(gae.advantages[0], 0.46575, kTolerance);
  EXPECT_NEAR(gae.advantages[4], 1.0, kTolerance);
  EXPECT_NEAR(gae.advantages[3], 0.2 + 0.95 * 1.0, kTolerance);
}

TEST(AdvantagesTest, GrpoAndDrGrpoMatchTheReferenceVectors) {
  const std::vector<double> scores = {1, 0, 1, 1, 0, 0, 0.7};
  const std::vector<int> groups = {0, 0, 0, 0, 1, 1, 2};
  EXPECT_THAT(GroupAdvantages(scores, groups, GroupBaseline::kGrpo),
              Pointwise(DoubleNear(kTolerance), std::vector<double>{0.499999, -1.499997, 0.499999,
                                                                    0.499999, 0, 0, 0.699999}));
  EXPECT_THAT(
      GroupAdvantages(scores, groups, GroupBaseline::kDrGrpo),
      Pointwise(DoubleNear(kTolerance), std::vector<double>{0.25, -0.75, 0.25, 0.25, 0, 0, 0.7}));
}

std::vector<double> Logs(const std::vector<double>& ratios) {
  std::vector<double> logs;
  for (double r : ratios) logs.push_back(std::log(r));
  return logs;
}

TEST(MismatchCorrectionTest, IcePopMatchesTheReferenceVector) {
  const IsWeights weights = ComputeIsWeights(Logs({0.4, 0.8, 6.0}), {1, 1, 1}, 1, 3,
                                             {.mode = IsMode::kIcePop, .upper = 5, .lower = 0.5});
  EXPECT_THAT(weights.weights, Pointwise(DoubleNear(kTolerance), std::vector<double>{0, 0.8, 0}));
  EXPECT_NEAR(weights.clipped_share, 2.0 / 3, kTolerance);
  EXPECT_NEAR(weights.ess, 1.0 / 3, kTolerance);
  EXPECT_THAT(weights.mask, ElementsAre(1, 1, 1)) << "IcePop leaves the mask alone";
}

TEST(MismatchCorrectionTest, TisClipsTokensOrWholeSequences) {
  const std::vector<double> log_ratio = Logs({0.5, 3.0, 1.5, 1.5});
  const std::vector<double> mask = {1, 1, 1, 0};
  const IsWeights token =
      ComputeIsWeights(log_ratio, mask, 2, 2, {.mode = IsMode::kTokenTis, .upper = 2});
  EXPECT_THAT(token.weights,
              Pointwise(DoubleNear(kTolerance), std::vector<double>{0.5, 2, 1.5, 1}));
  EXPECT_NEAR(token.clipped_share, 1.0 / 3, kTolerance);
  const IsWeights sequence =
      ComputeIsWeights(log_ratio, mask, 2, 2, {.mode = IsMode::kSequenceTis, .upper = 2});
  // Row 0: 0.5 * 3 = 1.5; row 1: 1.5 (its padded token does not count).
  EXPECT_THAT(sequence.weights,
              Pointwise(DoubleNear(kTolerance), std::vector<double>{1.5, 1.5, 1.5, 1}));
  EXPECT_EQ(sequence.clipped_share, 0);
}

TEST(MismatchCorrectionTest, RejectionDropsTokensOrSequences) {
  const std::vector<double> log_ratio = Logs({0.4, 1.0, 1.2, 1.1});
  const std::vector<double> mask = {1, 1, 1, 1};
  const IsWeights token = ComputeIsWeights(log_ratio, mask, 2, 2,
                                           {.mode = IsMode::kRejection, .upper = 2, .lower = 0.5});
  EXPECT_THAT(token.mask, ElementsAre(0, 1, 1, 1));
  EXPECT_NEAR(token.clipped_share, 0.25, kTolerance);
  const IsWeights sequence = ComputeIsWeights(
      log_ratio, mask, 2, 2,
      {.mode = IsMode::kRejection, .upper = 2, .lower = 0.7, .level = RejectionLevel::kSequence});
  // Row 0's geometric mean is sqrt(0.4) = 0.63 < 0.7: the whole row goes.
  EXPECT_THAT(sequence.mask, ElementsAre(0, 0, 1, 1));
  EXPECT_THAT(sequence.weights, ElementsAre(1, 1, 1, 1));
}

TEST(PolicyLossTest, KlEstimatorsMatchTheirDefinitions) {
  EXPECT_DOUBLE_EQ(KlEstimate(0.3, KlEstimator::kK1), 0.3);
  EXPECT_DOUBLE_EQ(KlEstimate(0.3, KlEstimator::kK2), 0.045);
  EXPECT_NEAR(KlEstimate(0.3, KlEstimator::kK3), std::exp(-0.3) + 0.3 - 1, 1e-12);
}

TEST(PolicyLossTest, ClipAndDualClipFollowThePpoDefinition) {
  // Token 0: A > 0, ratio 1.5 -> clipped at 1.2; token 1: A < 0, ratio 5 -> dual clip at c = 3;
  // token 2: A < 0, ratio 0.9 -> unclipped.
  const std::vector<double> old_logp = {0, 0, 0};
  const std::vector<double> logp = {std::log(1.5), std::log(5.0), std::log(0.9)};
  const std::vector<double> advantages = {1, -1, -2};
  const std::vector<double> mask = {1, 1, 1};
  const PolicyLossResult result = ComputePolicyLoss({.logp = logp,
                                                     .old_logp = old_logp,
                                                     .advantages = advantages,
                                                     .mask = mask,
                                                     .rows = 1,
                                                     .cols = 3},
                                                    {});
  EXPECT_NEAR(result.loss, (-1.2 + 3 + 2 * 0.9) / 3, kTolerance);
  EXPECT_NEAR(result.clip_share, 2.0 / 3, kTolerance);
  EXPECT_THAT(result.dlogp, Pointwise(DoubleNear(kTolerance), std::vector<double>{0, 0, 0.6}));
}

class PolicyLossGradientTest : public ::testing::TestWithParam<Aggregation> {};

TEST_P(PolicyLossGradientTest, GradientMatchesFiniteDifferences) {
  constexpr int kRows = 3, kCols = 5;
  std::mt19937_64 rng(5);
  std::normal_distribution<double> normal(0, 0.05);
  std::vector<double> logp(kRows * kCols), old_logp(kRows * kCols), advantages(kRows * kCols),
      weights(kRows * kCols), ref_logp(kRows * kCols);
  const std::vector<double> mask = {1, 1, 1, 1, 0, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1};
  for (int i = 0; i < kRows * kCols; ++i) {
    old_logp[i] = -1 - std::abs(normal(rng)) * 10;
    logp[i] = old_logp[i] + normal(rng);  // Ratios within the clip range: gradients flow.
    advantages[i] = normal(rng) * 20;
    weights[i] = 0.5 + std::abs(normal(rng)) * 5;
    ref_logp[i] = old_logp[i] + normal(rng);
  }
  const PolicyLossConfig config{.aggregation = GetParam(), .kl_coef = 0.1};
  const auto loss = [&](const std::vector<double>& at) {
    return ComputePolicyLoss({.logp = at,
                              .old_logp = old_logp,
                              .advantages = advantages,
                              .mask = mask,
                              .weights = weights,
                              .ref_logp = ref_logp,
                              .rows = kRows,
                              .cols = kCols},
                             config);
  };
  const PolicyLossResult result = loss(logp);
  EXPECT_EQ(result.clip_share, 0);
  for (int i = 0; i < kRows * kCols; ++i) {
    constexpr double kStep = 1e-6;
    std::vector<double> plus = logp, minus = logp;
    plus[i] += kStep;
    minus[i] -= kStep;
    const double numeric = (loss(plus).loss - loss(minus).loss) / (2 * kStep);
    EXPECT_NEAR(result.dlogp[i], numeric, 1e-6) << "token " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(AllAggregations, PolicyLossGradientTest,
                         ::testing::Values(Aggregation::kTokenMean, Aggregation::kSeqMeanTokenSum,
                                           Aggregation::kSeqMeanTokenMean));

}  // namespace
}  // namespace tandem::trainer
