#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/grouped_lora.h"
#include "kernels/cpu/permute.h"
#include "kernels/cpu/reference_moe.h"
#include "kernels/cpu/router.h"
#include "kernels/routes.h"

namespace tandem::cpu {
namespace {

using ::tandem::kernels::ValidateRoutes;
using ::testing::AssertionFailure;
using ::testing::AssertionResult;
using ::testing::AssertionSuccess;

constexpr kernels::ScoringFunction kScorings[] = {kernels::ScoringFunction::kSoftmax,
                                                  kernels::ScoringFunction::kSigmoid};

std::vector<float> Random(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// k distinct experts per token, in random order.
std::vector<int16_t> RandomRoutes(int T, int k, int E, std::mt19937& rng) {
  std::vector<int16_t> all(E);
  std::iota(all.begin(), all.end(), 0);
  std::vector<int16_t> ids;
  for (int t = 0; t < T; ++t) {
    std::shuffle(all.begin(), all.end(), rng);
    ids.insert(ids.end(), all.begin(), all.begin() + k);
  }
  return ids;
}

// Reports only the first mismatch, so a wrong kernel does not flood the log.
AssertionResult AllNear(const std::vector<float>& actual, const std::vector<float>& expected,
                        double tolerance) {
  if (actual.size() != expected.size()) {
    return AssertionFailure() << "size " << actual.size() << " vs " << expected.size();
  }
  for (size_t i = 0; i < actual.size(); ++i) {
    const double error = std::abs(double{actual[i]} - expected[i]);
    if (!(error <= tolerance * (1.0 + std::abs(double{expected[i]})))) {
      return AssertionFailure() << "index " << i << ": " << actual[i] << " vs " << expected[i];
    }
  }
  return AssertionSuccess();
}

double Dot(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0.0;
  for (size_t i = 0; i < a.size(); ++i) sum += double{a[i]} * b[i];
  return sum;
}

// Central differences of loss() with respect to every entry of params, compared with analytic.
template <typename Loss>
AssertionResult MatchesFiniteDifferences(std::vector<float>& params, const Loss& loss,
                                         const std::vector<float>& analytic, float eps,
                                         double tolerance) {
  for (size_t i = 0; i < params.size(); ++i) {
    const float saved = params[i];
    params[i] = saved + eps;
    const float plus = params[i];
    const double loss_plus = loss();
    params[i] = saved - eps;
    const float minus = params[i];
    const double loss_minus = loss();
    params[i] = saved;
    // The representable step, not eps, is what the loss saw.
    const double numeric = (loss_plus - loss_minus) / (double{plus} - minus);
    if (!(std::abs(numeric - analytic[i]) <= tolerance * (1.0 + std::abs(numeric)))) {
      return AssertionFailure() << "index " << i << ": analytic " << analytic[i] << " numeric "
                                << numeric;
    }
  }
  return AssertionSuccess();
}

// ---------------------------------------------------------------------------------------------
// Router

TEST(RouterScoresTest, MatchesReference) {
  std::mt19937 rng(1);
  for (kernels::ScoringFunction scoring : kScorings) {
    for (auto [T, E] : {std::pair{7, 13}, std::pair{3, 600}, std::pair{1, 1}}) {
      const std::vector<float> logits = Random(T * E, rng, -4.0f, 4.0f);
      std::vector<float> scores(T * E), expected(T * E);
      RouterScores(logits.data(), scores.data(), T, E, scoring);
      reference::RouterScores(logits.data(), expected.data(), T, E, scoring);
      EXPECT_TRUE(AllNear(scores, expected, 1e-6)) << "T=" << T << " E=" << E;
    }
  }
}

TEST(RouterScoresTest, SoftmaxIsStableForLargeLogits) {
  const std::vector<float> logits = {1000.0f, 999.0f, -1000.0f};
  std::vector<float> scores(3);
  RouterScores(logits.data(), scores.data(), 1, 3, kernels::ScoringFunction::kSoftmax);
  EXPECT_NEAR(scores[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(scores[1], 1.0 / (1.0 + std::exp(1.0)), 1e-6);
  EXPECT_EQ(scores[2], 0.0f);
}

TEST(TopKTest, MatchesReferenceWithAndWithoutBias) {
  std::mt19937 rng(2);
  for (int E : {13, 256, 384, 600}) {
    for (int k : {1, 2, 6, 8}) {
      const int T = 9;
      std::vector<float> scores(T * E);
      const std::vector<float> logits = Random(T * E, rng, -3.0f, 3.0f);
      RouterScores(logits.data(), scores.data(), T, E, kernels::ScoringFunction::kSoftmax);
      const std::vector<float> bias = Random(E, rng, -0.01f, 0.01f);
      for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
        std::vector<int16_t> ids(T * k), expected(T * k);
        TopK(scores.data(), b, T, E, k, ids.data());
        reference::TopK(scores.data(), b, T, E, k, expected.data());
        EXPECT_EQ(ids, expected) << "E=" << E << " k=" << k << " bias=" << (b != nullptr);
        EXPECT_EQ(ValidateRoutes(ids.data(), T, k, E), "");
      }
    }
  }
}

TEST(TopKTest, MatchesReferenceWhenScoresTieOften) {
  std::mt19937 rng(17);
  std::uniform_int_distribution<int> level(0, 3);
  for (auto [E, k] : {std::pair{13, 8}, std::pair{600, 64}, std::pair{64, 64}}) {
    const int T = 5;
    std::vector<float> scores(T * E), bias(E);
    for (float& s : scores) s = 0.25f * level(rng);
    for (float& b : bias) b = 0.25f * level(rng);
    for (const float* b : {static_cast<const float*>(nullptr), std::as_const(bias).data()}) {
      std::vector<int16_t> ids(T * k), expected(T * k);
      TopK(scores.data(), b, T, E, k, ids.data());
      reference::TopK(scores.data(), b, T, E, k, expected.data());
      EXPECT_EQ(ids, expected) << "E=" << E << " k=" << k << " bias=" << (b != nullptr);
    }
  }
}

TEST(TopKTest, GroupLimitedMatchesReference) {
  std::mt19937 rng(23);
  for (auto [E, groups, kept, k] :
       {std::tuple{16, 4, 2, 4}, std::tuple{256, 8, 4, 8}, std::tuple{12, 6, 1, 2}}) {
    const int T = 11;
    std::vector<float> scores(T * E);
    const std::vector<float> logits = Random(T * E, rng, -3.0f, 3.0f);
    RouterScores(logits.data(), scores.data(), T, E, kernels::ScoringFunction::kSigmoid);
    const std::vector<float> bias = Random(E, rng, -0.5f, 0.5f);
    std::vector<int16_t> ids(T * k), expected(T * k);
    TopK(scores.data(), bias.data(), T, E, k, ids.data(), {groups, kept});
    reference::TopK(scores.data(), bias.data(), T, E, k, expected.data(), {groups, kept});
    EXPECT_EQ(ids, expected) << "E=" << E << " groups=" << groups;
    EXPECT_EQ(ValidateRoutes(ids.data(), T, k, E), "");
  }
}

// Two groups of three; group 0 scores 0.9 + 0.8, group 1 scores 0.3 + 0.2 and is masked to 0,
// which still beats group 0's negative third key (as transformers' masked_fill(0.0) does).
TEST(TopKTest, GroupLimitMasksWeakGroupsWithZero) {
  const std::vector<float> keys = {0.9f, 0.8f, -0.4f, 0.3f, 0.2f, 0.1f};
  std::vector<int16_t> ids(3);
  TopK(keys.data(), nullptr, 1, 6, 3, ids.data(), {.groups = 2, .kept_groups = 1});
  EXPECT_THAT(ids, ::testing::ElementsAre(0, 1, 3));
  TopK(keys.data(), nullptr, 1, 6, 3, ids.data());
  EXPECT_THAT(ids, ::testing::ElementsAre(0, 1, 3)) << "no limit: 0.3 is third anyway";
  std::vector<int16_t> two(2);
  TopK(keys.data(), nullptr, 1, 6, 2, two.data(), {.groups = 2, .kept_groups = 2});
  EXPECT_THAT(two, ::testing::ElementsAre(0, 1));
}

TEST(TopKTest, SelectsExpertIdsAbove255) {
  const int E = 600, k = 8;
  std::vector<float> scores(E, 0.0f);
  for (int j = 0; j < k; ++j) scores[592 + j] = 1.0f + j;  // the best is 599
  std::vector<int16_t> ids(k);
  TopK(scores.data(), nullptr, 1, E, k, ids.data());
  EXPECT_THAT(ids, ::testing::ElementsAre(599, 598, 597, 596, 595, 594, 593, 592));
}

TEST(TopKTest, BreaksTiesByLowerExpertId) {
  const std::vector<float> equal(10, 0.1f);
  std::vector<int16_t> ids(4);
  TopK(equal.data(), nullptr, 1, 10, 4, ids.data());
  EXPECT_THAT(ids, ::testing::ElementsAre(0, 1, 2, 3));

  const std::vector<float> scores = {0.5f, 0.9f, 0.5f, 0.9f, 0.1f};
  ids.resize(3);
  TopK(scores.data(), nullptr, 1, 5, 3, ids.data());
  EXPECT_THAT(ids, ::testing::ElementsAre(1, 3, 0));

  // The tie is in score + bias (exact in float), not in the scores.
  const std::vector<float> tie_scores = {0.25f, 0.5f, 0.0f};
  const std::vector<float> tie_bias = {0.25f, 0.0f, 0.0f};
  ids.resize(2);
  TopK(tie_scores.data(), tie_bias.data(), 1, 3, 2, ids.data());
  EXPECT_THAT(ids, ::testing::ElementsAre(0, 1));
}

TEST(TopKTest, NanRanksLastAndIdsStayDistinct) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> scores = {nan, 0.2f, nan, 0.1f};
  std::vector<int16_t> ids(3);
  TopK(scores.data(), nullptr, 1, 4, 3, ids.data());
  EXPECT_THAT(ids, ::testing::ElementsAre(1, 3, 0));
}

TEST(GateWeightsTest, BiasSelectsButGatesUseUnbiasedScores) {
  const std::vector<float> scores = {0.4f, 0.3f, 0.2f, 0.1f};
  const std::vector<float> bias = {0.0f, 0.0f, 0.0f, 0.5f};
  std::vector<int16_t> ids(2);
  TopK(scores.data(), bias.data(), 1, 4, 2, ids.data());
  ASSERT_THAT(ids, ::testing::ElementsAre(3, 0));
  std::vector<float> gates(2);
  GateWeights(scores.data(), ids.data(), 1, 4, 2, /*normalize=*/true, gates.data());
  EXPECT_FLOAT_EQ(gates[0], 0.2f);
  EXPECT_FLOAT_EQ(gates[1], 0.8f);
  GateWeights(scores.data(), ids.data(), 1, 4, 2, /*normalize=*/false, gates.data());
  EXPECT_FLOAT_EQ(gates[0], 0.1f);
  EXPECT_FLOAT_EQ(gates[1], 0.4f);
}

TEST(GateWeightsTest, MatchesReference) {
  std::mt19937 rng(3);
  for (kernels::ScoringFunction scoring : kScorings) {
    for (bool normalize : {false, true}) {
      const int T = 11, E = 384, k = 8;
      const std::vector<float> logits = Random(T * E, rng, -3.0f, 3.0f);
      std::vector<float> scores(T * E);
      RouterScores(logits.data(), scores.data(), T, E, scoring);
      const std::vector<int16_t> ids = RandomRoutes(T, k, E, rng);
      std::vector<float> gates(T * k), expected(T * k);
      GateWeights(scores.data(), ids.data(), T, E, k, normalize, gates.data());
      reference::GateWeights(scores.data(), ids.data(), T, E, k, normalize, expected.data());
      EXPECT_TRUE(AllNear(gates, expected, 1e-6));
    }
  }
}

TEST(GateWeightsTest, NormalizedSoftmaxIsTheR3Formula) {
  std::mt19937 rng(4);
  const int T = 6, E = 17, k = 5;
  const std::vector<float> logits = Random(T * E, rng, -5.0f, 5.0f);
  std::vector<float> scores(T * E), gates(T * k);
  RouterScores(logits.data(), scores.data(), T, E, kernels::ScoringFunction::kSoftmax);
  const std::vector<int16_t> ids = RandomRoutes(T, k, E, rng);
  GateWeights(scores.data(), ids.data(), T, E, k, /*normalize=*/true, gates.data());
  for (int t = 0; t < T; ++t) {
    double z = 0.0;
    for (int j = 0; j < k; ++j) z += std::exp(double{logits[t * E + ids[t * k + j]]});
    for (int j = 0; j < k; ++j) {
      EXPECT_NEAR(gates[t * k + j], std::exp(double{logits[t * E + ids[t * k + j]]}) / z, 1e-6);
    }
  }
}

struct RouterCase {
  kernels::ScoringFunction scoring;
  bool normalize;
};

class RouterGatesBackwardTest : public ::testing::TestWithParam<RouterCase> {};

TEST_P(RouterGatesBackwardTest, MatchesReference) {
  const auto [scoring, normalize] = GetParam();
  std::mt19937 rng(5);
  for (auto [T, E, k] : {std::tuple{5, 11, 3}, std::tuple{3, 600, 8}, std::tuple{2, 4, 4}}) {
    const std::vector<float> logits = Random(T * E, rng, -3.0f, 3.0f);
    std::vector<float> scores(T * E);
    RouterScores(logits.data(), scores.data(), T, E, scoring);
    const std::vector<int16_t> ids = RandomRoutes(T, k, E, rng);
    const std::vector<float> dgates = Random(T * k, rng);
    // Non-zero starting values check that the kernel accumulates.
    std::vector<float> dlogits = Random(T * E, rng);
    std::vector<float> expected = dlogits;
    RouterGatesBackward(logits.data(), scores.data(), ids.data(), dgates.data(), dlogits.data(), T,
                        E, k, normalize, scoring);
    reference::RouterGatesBackward(logits.data(), scores.data(), ids.data(), dgates.data(),
                                   expected.data(), T, E, k, normalize, scoring);
    EXPECT_TRUE(AllNear(dlogits, expected, 1e-5)) << "T=" << T << " E=" << E << " k=" << k;
  }
}

TEST_P(RouterGatesBackwardTest, MatchesFiniteDifferences) {
  const auto [scoring, normalize] = GetParam();
  std::mt19937 rng(6);
  const int T = 4, E = 9, k = 3;
  std::vector<float> logits = Random(T * E, rng, -2.0f, 2.0f);
  const std::vector<int16_t> ids = RandomRoutes(T, k, E, rng);
  const std::vector<float> weights = Random(T * k, rng);
  std::vector<float> scores(T * E), gates(T * k);
  // The ids stay fixed while logits move: exactly the replay setting.
  const auto loss = [&] {
    RouterScores(logits.data(), scores.data(), T, E, scoring);
    GateWeights(scores.data(), ids.data(), T, E, k, normalize, gates.data());
    return Dot(weights, gates);
  };
  loss();
  std::vector<float> dlogits(T * E, 0.0f);
  RouterGatesBackward(logits.data(), scores.data(), ids.data(), weights.data(), dlogits.data(), T,
                      E, k, normalize, scoring);
  EXPECT_TRUE(MatchesFiniteDifferences(logits, loss, dlogits, 1e-2f, 2e-3));
}

TEST(RouterGatesBackwardTest, NormalizedSoftmaxLeavesUnselectedLogitsAlone) {
  std::mt19937 rng(7);
  const int T = 3, E = 10, k = 2;
  const std::vector<float> logits = Random(T * E, rng, -2.0f, 2.0f);
  std::vector<float> scores(T * E);
  RouterScores(logits.data(), scores.data(), T, E, kernels::ScoringFunction::kSoftmax);
  const std::vector<int16_t> ids = RandomRoutes(T, k, E, rng);
  const std::vector<float> dgates = Random(T * k, rng);
  std::vector<float> dlogits(T * E, 0.0f);
  RouterGatesBackward(logits.data(), scores.data(), ids.data(), dgates.data(), dlogits.data(), T, E,
                      k, /*normalize=*/true, kernels::ScoringFunction::kSoftmax);
  for (int t = 0; t < T; ++t) {
    for (int e = 0; e < E; ++e) {
      const bool selected = ids[t * k] == e || ids[t * k + 1] == e;
      if (!selected) {
        EXPECT_EQ(dlogits[t * E + e], 0.0f) << "token " << t << " expert " << e;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllScorings, RouterGatesBackwardTest,
                         ::testing::Values(RouterCase{kernels::ScoringFunction::kSoftmax, false},
                                           RouterCase{kernels::ScoringFunction::kSoftmax, true},
                                           RouterCase{kernels::ScoringFunction::kSigmoid, false},
                                           RouterCase{kernels::ScoringFunction::kSigmoid, true}),
                         [](const ::testing::TestParamInfo<RouterCase>& info) {
                           return std::string(info.param.scoring ==
                                                      kernels::ScoringFunction::kSoftmax
                                                  ? "Softmax"
                                                  : "Sigmoid") +
                                  (info.param.normalize ? "Normalized" : "Raw");
                         });

// ---------------------------------------------------------------------------------------------
// ValidateRoutes

TEST(ValidateRoutesTest, AcceptsValidRowsAndAllMissingRows) {
  const std::vector<int16_t> ids = {0, 255, -1, -1, 7, 3};
  EXPECT_EQ(ValidateRoutes(ids.data(), 3, 2, 256), "");
  EXPECT_EQ(ValidateRoutes(ids.data(), 0, 2, 256), "");
}

TEST(ValidateRoutesTest, NamesTokenSlotAndValue) {
  std::vector<int16_t> ids(4 * 2, 0);
  for (int t = 0; t < 4; ++t) ids[t * 2 + 1] = 1;
  ids[3 * 2 + 1] = 300;
  EXPECT_EQ(ValidateRoutes(ids.data(), 4, 2, 256),
            "token 3 slot 1: expert 300 out of range [0, 256)");
  ids[3 * 2 + 1] = -2;
  EXPECT_EQ(ValidateRoutes(ids.data(), 4, 2, 256),
            "token 3 slot 1: expert -2 out of range [0, 256)");
}

TEST(ValidateRoutesTest, RejectsDuplicates) {
  std::vector<int16_t> ids;
  for (int t = 0; t < 6; ++t) ids.insert(ids.end(), {1, 2, 3});
  ids[5 * 3 + 0] = 7;
  ids[5 * 3 + 2] = 7;
  EXPECT_EQ(ValidateRoutes(ids.data(), 6, 3, 8), "token 5: expert 7 appears twice");
}

TEST(ValidateRoutesTest, RejectsRowsMixingMissingAndExperts) {
  const std::vector<int16_t> ids = {0, 1, -1, -1, -1, 4};
  EXPECT_EQ(ValidateRoutes(ids.data(), 3, 2, 8), "token 2: mixes -1 and expert ids");
}

TEST(ValidateRoutesTest, HandlesMoreThan256Experts) {
  const std::vector<int16_t> ids = {300, 383, 0, 299};
  EXPECT_EQ(ValidateRoutes(ids.data(), 2, 2, 384), "");
  const std::vector<int16_t> bad = {300, 384};
  EXPECT_EQ(ValidateRoutes(bad.data(), 1, 2, 384),
            "token 0 slot 1: expert 384 out of range [0, 384)");
  const std::vector<int16_t> wide = {599, 256};
  EXPECT_EQ(ValidateRoutes(wide.data(), 1, 2, 600), "");
}

TEST(ValidateRoutesTest, RejectsBadShapes) {
  const std::vector<int16_t> ids = {0, 1};
  EXPECT_EQ(ValidateRoutes(ids.data(), 1, 0, 8), "top-k 0 out of range [1, 64]");
  EXPECT_EQ(ValidateRoutes(ids.data(), 1, 65, 128), "top-k 65 out of range [1, 64]");
  EXPECT_EQ(ValidateRoutes(ids.data(), 1, 2, 40000), "expert count 40000 out of range [1, 32767]");
  EXPECT_EQ(ValidateRoutes(ids.data(), 1, 2, 1), "top-k 2 exceeds expert count 1");
}

TEST(ValidateRoutesTest, MatchesReferenceOnRandomRoutes) {
  std::mt19937 rng(8);
  std::uniform_int_distribution<int> id(-2, 12);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<int16_t> ids(3 * 4);
    for (int16_t& v : ids) v = static_cast<int16_t>(id(rng));
    EXPECT_EQ(ValidateRoutes(ids.data(), 3, 4, 11),
              reference::ValidateRoutes(ids.data(), 3, 4, 11));
  }
}

// ---------------------------------------------------------------------------------------------
// Permutation

TEST(BuildPermutationTest, MatchesReferenceAndCoversEverySlotOnce) {
  std::mt19937 rng(9);
  for (int E : {13, 256, 384, 600}) {
    for (int k : {1, 2, 8}) {
      const int T = 37;
      const std::vector<int16_t> ids = RandomRoutes(T, k, E, rng);
      const ExpertPermutation permutation = BuildPermutation(ids.data(), T, k, E);
      const ExpertPermutation expected = reference::BuildPermutation(ids.data(), T, k, E);
      EXPECT_EQ(permutation.offsets, expected.offsets);
      EXPECT_EQ(permutation.source, expected.source);
      EXPECT_EQ(permutation.k, k);
      std::vector<int> seen(T * k, 0);
      for (int s : permutation.source) ++seen[s];
      EXPECT_EQ(seen, std::vector<int>(T * k, 1)) << "E=" << E << " k=" << k;
      for (int e = 0; e < E; ++e) {
        for (int p = permutation.offsets[e]; p < permutation.offsets[e + 1]; ++p) {
          ASSERT_EQ(ids[permutation.source[p]], e);
          if (p > permutation.offsets[e]) {
            ASSERT_LT(permutation.source[p - 1], permutation.source[p]);  // stable
          }
        }
      }
    }
  }
}

TEST(BuildPermutationTest, HandlesNoTokens) {
  const ExpertPermutation permutation = BuildPermutation(nullptr, 0, 2, 5);
  EXPECT_EQ(permutation.offsets, std::vector<int>(6, 0));
  EXPECT_TRUE(permutation.source.empty());
}

TEST(BuildPermutationDeathTest, AbortsOnOutOfRangeExpert) {
  // OpenBLAS has started its worker threads by now; a plain fork() would inherit them half-alive.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::vector<int16_t> ids = {0, 300};
  EXPECT_DEATH(BuildPermutation(ids.data(), 1, 2, 256), "expert 300, out of range");
}

struct PermuteFixture {
  static constexpr int T = 19, k = 3, E = 7, d = 13;
  std::mt19937 rng{10};
  std::vector<int16_t> ids = RandomRoutes(T, k, E, rng);
  ExpertPermutation permutation = BuildPermutation(ids.data(), T, k, E);
};

TEST(PermuteRowsTest, ForwardAndBackwardMatchReference) {
  PermuteFixture f;
  const int T = f.T, k = f.k, d = f.d;
  const std::vector<float> x = Random(T * d, f.rng);
  std::vector<float> out(T * k * d), expected(T * k * d);
  PermuteRows(x.data(), f.permutation, out.data(), d);
  reference::PermuteRows(x.data(), f.permutation, expected.data(), d);
  EXPECT_EQ(out, expected);

  const std::vector<float> dout = Random(T * k * d, f.rng);
  std::vector<float> dx = Random(T * d, f.rng);
  std::vector<float> expected_dx = dx;
  PermuteRowsBackward(dout.data(), f.permutation, dx.data(), d);
  reference::PermuteRowsBackward(dout.data(), f.permutation, expected_dx.data(), d);
  EXPECT_TRUE(AllNear(dx, expected_dx, 1e-6));
}

TEST(PermuteRowsTest, BackwardMatchesFiniteDifferences) {
  PermuteFixture f;
  const int T = f.T, k = f.k, d = f.d;
  std::vector<float> x = Random(T * d, f.rng);
  const std::vector<float> weights = Random(T * k * d, f.rng);
  std::vector<float> out(T * k * d);
  const auto loss = [&] {
    PermuteRows(x.data(), f.permutation, out.data(), d);
    return Dot(weights, out);
  };
  std::vector<float> dx(T * d, 0.0f);
  PermuteRowsBackward(weights.data(), f.permutation, dx.data(), d);
  EXPECT_TRUE(MatchesFiniteDifferences(x, loss, dx, 1e-2f, 1e-3));
}

TEST(UnpermuteAddTest, ForwardAndBackwardMatchReference) {
  PermuteFixture f;
  const int T = f.T, k = f.k, d = f.d;
  const std::vector<float> y = Random(T * k * d, f.rng);
  const std::vector<float> gates = Random(T * k, f.rng, 0.0f, 1.0f);
  std::vector<float> out = Random(T * d, f.rng);
  std::vector<float> expected = out;
  UnpermuteAdd(y.data(), f.permutation, gates.data(), out.data(), d);
  reference::UnpermuteAdd(y.data(), f.permutation, gates.data(), expected.data(), d);
  EXPECT_TRUE(AllNear(out, expected, 1e-6));

  const std::vector<float> dout = Random(T * d, f.rng);
  std::vector<float> dy = Random(T * k * d, f.rng), dgates = Random(T * k, f.rng);
  std::vector<float> expected_dy = dy, expected_dgates = dgates;
  UnpermuteAddBackward(y.data(), f.permutation, gates.data(), dout.data(), dy.data(), dgates.data(),
                       d);
  reference::UnpermuteAddBackward(y.data(), f.permutation, gates.data(), dout.data(),
                                  expected_dy.data(), expected_dgates.data(), d);
  EXPECT_TRUE(AllNear(dy, expected_dy, 1e-6));
  EXPECT_TRUE(AllNear(dgates, expected_dgates, 1e-5));

  // Each gradient output is optional on its own.
  std::vector<float> dy_only(T * k * d, 0.0f), dgates_only(T * k, 0.0f);
  UnpermuteAddBackward(y.data(), f.permutation, gates.data(), dout.data(), dy_only.data(), nullptr,
                       d);
  UnpermuteAddBackward(y.data(), f.permutation, gates.data(), dout.data(), nullptr,
                       dgates_only.data(), d);
  std::vector<float> dy_both(T * k * d, 0.0f), dgates_both(T * k, 0.0f);
  UnpermuteAddBackward(y.data(), f.permutation, gates.data(), dout.data(), dy_both.data(),
                       dgates_both.data(), d);
  EXPECT_EQ(dy_only, dy_both);
  EXPECT_EQ(dgates_only, dgates_both);
}

TEST(UnpermuteAddTest, BackwardMatchesFiniteDifferences) {
  PermuteFixture f;
  const int T = f.T, k = f.k, d = f.d;
  std::vector<float> y = Random(T * k * d, f.rng);
  std::vector<float> gates = Random(T * k, f.rng, 0.0f, 1.0f);
  const std::vector<float> weights = Random(T * d, f.rng);
  std::vector<float> out(T * d);
  const auto loss = [&] {
    std::fill(out.begin(), out.end(), 0.0f);
    UnpermuteAdd(y.data(), f.permutation, gates.data(), out.data(), d);
    return Dot(weights, out);
  };
  std::vector<float> dy(T * k * d, 0.0f), dgates(T * k, 0.0f);
  UnpermuteAddBackward(y.data(), f.permutation, gates.data(), weights.data(), dy.data(),
                       dgates.data(), d);
  EXPECT_TRUE(MatchesFiniteDifferences(y, loss, dy, 1e-2f, 1e-3));
  EXPECT_TRUE(MatchesFiniteDifferences(gates, loss, dgates, 1e-2f, 1e-3));
}

TEST(UnpermuteAddTest, RoundTripWithGatesSummingToOneRestoresInput) {
  PermuteFixture f;
  const int T = f.T, k = f.k, d = f.d;
  const std::vector<float> x = Random(T * d, f.rng);
  std::vector<float> permuted(T * k * d), out(T * d, 0.0f);
  PermuteRows(x.data(), f.permutation, permuted.data(), d);
  const std::vector<float> gates(T * k, 1.0f / k);
  UnpermuteAdd(permuted.data(), f.permutation, gates.data(), out.data(), d);
  EXPECT_TRUE(AllNear(out, x, 1e-6));
}

// ---------------------------------------------------------------------------------------------
// Grouped LoRA

enum class Layout { kPerExpert, kShared, kSharedOuterGateUp, kSharedOuterDown };

struct LoraSetup {
  int groups, in, out, rank;
  std::vector<int> offsets;
  std::vector<float> a, b;
  kernels::GroupedLoraWeights weights;
  int rows() const { return offsets.back(); }
};

LoraSetup MakeLora(Layout layout, std::vector<int> offsets, int in, int out, int rank,
                   std::mt19937& rng) {
  LoraSetup s{static_cast<int>(offsets.size()) - 1, in, out, rank, std::move(offsets), {}, {}, {}};
  const bool per_group_a = layout == Layout::kPerExpert || layout == Layout::kSharedOuterDown;
  const bool per_group_b = layout == Layout::kPerExpert || layout == Layout::kSharedOuterGateUp;
  const int64_t a_stride = per_group_a ? int64_t{rank} * in : 0;
  const int64_t b_stride = per_group_b ? int64_t{out} * rank : 0;
  s.a = Random((per_group_a ? s.groups : 1) * rank * in, rng);
  s.b = Random((per_group_b ? s.groups : 1) * out * rank, rng);
  s.weights = {s.a.data(), s.b.data(), a_stride, b_stride, rank, 2.0f / rank};
  return s;
}

// Empty groups first, last and in the middle, and a first group that starts past row 0.
const std::vector<int> kOffsets = {2, 2, 7, 8, 8, 15, 21, 21};

class GroupedLoraTest : public ::testing::TestWithParam<Layout> {};

TEST_P(GroupedLoraTest, ForwardMatchesReference) {
  std::mt19937 rng(11);
  LoraSetup s = MakeLora(GetParam(), kOffsets, 19, 23, 5, rng);
  const std::vector<float> x = Random(s.rows() * s.in, rng);
  std::vector<float> h(s.rows() * s.rank, -7.0f), y = Random(s.rows() * s.out, rng);
  std::vector<float> expected_h = h, expected_y = y;
  GroupedLoraForward(x.data(), s.offsets.data(), s.groups, s.in, s.out, s.weights, h.data(),
                     y.data());
  reference::GroupedLoraForward(x.data(), s.offsets.data(), s.groups, s.in, s.out, s.weights,
                                expected_h.data(), expected_y.data());
  EXPECT_TRUE(AllNear(h, expected_h, 1e-5));
  EXPECT_TRUE(AllNear(y, expected_y, 1e-5));
}

TEST_P(GroupedLoraTest, BackwardMatchesReference) {
  std::mt19937 rng(12);
  LoraSetup s = MakeLora(GetParam(), kOffsets, 19, 23, 5, rng);
  const std::vector<float> x = Random(s.rows() * s.in, rng);
  const std::vector<float> dy = Random(s.rows() * s.out, rng);
  std::vector<float> h(s.rows() * s.rank), y(s.rows() * s.out, 0.0f);
  GroupedLoraForward(x.data(), s.offsets.data(), s.groups, s.in, s.out, s.weights, h.data(),
                     y.data());
  std::vector<float> dx = Random(x.size(), rng), da = Random(s.a.size(), rng),
                     db = Random(s.b.size(), rng);
  std::vector<float> expected_dx = dx, expected_da = da, expected_db = db;
  GroupedLoraBackward(x.data(), s.offsets.data(), s.groups, s.in, s.out, s.weights, h.data(),
                      dy.data(), dx.data(), da.data(), db.data());
  reference::GroupedLoraBackward(x.data(), s.offsets.data(), s.groups, s.in, s.out, s.weights,
                                 h.data(), dy.data(), expected_dx.data(), expected_da.data(),
                                 expected_db.data());
  EXPECT_TRUE(AllNear(dx, expected_dx, 1e-5));
  EXPECT_TRUE(AllNear(da, expected_da, 1e-5));
  EXPECT_TRUE(AllNear(db, expected_db, 1e-5));

  // Any subset of gradient outputs gives the same values for the ones asked for.
  std::vector<float> dx_only(x.size(), 0.0f), da_only(s.a.size(), 0.0f), db_only(s.b.size(), 0.0f);
  GroupedLoraBackward(x.data(), s.offsets.data(), s.groups, s.in, s.out, s.weights, h.data(),
                      dy.data(), dx_only.data(), nullptr, nullptr);
  GroupedLoraBackward(x.data(), s.offsets.data(), s.groups, s.in, s.out, s.weights, h.data(),
                      dy.data(), nullptr, da_only.data(), nullptr);
  GroupedLoraBackward(x.data(), s.offsets.data(), s.groups, s.in, s.out, s.weights, h.data(),
                      dy.data(), nullptr, nullptr, db_only.data());
  std::vector<float> dx_all(x.size(), 0.0f), da_all(s.a.size(), 0.0f), db_all(s.b.size(), 0.0f);
  GroupedLoraBackward(x.data(), s.offsets.data(), s.groups, s.in, s.out, s.weights, h.data(),
                      dy.data(), dx_all.data(), da_all.data(), db_all.data());
  EXPECT_EQ(dx_only, dx_all);
  EXPECT_EQ(da_only, da_all);
  EXPECT_EQ(db_only, db_all);
}

TEST_P(GroupedLoraTest, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(13);
  LoraSetup s = MakeLora(GetParam(), {0, 3, 3, 7, 8}, 6, 5, 3, rng);
  std::vector<float> x = Random(s.rows() * s.in, rng);
  const std::vector<float> weights = Random(s.rows() * s.out, rng);
  std::vector<float> h(s.rows() * s.rank), y(s.rows() * s.out);
  const auto loss = [&] {
    std::fill(y.begin(), y.end(), 0.0f);
    GroupedLoraForward(x.data(), s.offsets.data(), s.groups, s.in, s.out, s.weights, h.data(),
                       y.data());
    return Dot(weights, y);
  };
  loss();
  std::vector<float> dx(x.size(), 0.0f), da(s.a.size(), 0.0f), db(s.b.size(), 0.0f);
  GroupedLoraBackward(x.data(), s.offsets.data(), s.groups, s.in, s.out, s.weights, h.data(),
                      weights.data(), dx.data(), da.data(), db.data());
  EXPECT_TRUE(MatchesFiniteDifferences(x, loss, dx, 1e-2f, 1e-3));
  EXPECT_TRUE(MatchesFiniteDifferences(s.a, loss, da, 1e-2f, 1e-3));
  EXPECT_TRUE(MatchesFiniteDifferences(s.b, loss, db, 1e-2f, 1e-3));
}

// x . (W_g + scale * B_g . A_g)^T, in double, against x . W_g^T + GroupedLoraForward.
TEST_P(GroupedLoraTest, EqualsMergedWeight) {
  std::mt19937 rng(14);
  LoraSetup s = MakeLora(GetParam(), kOffsets, 19, 23, 5, rng);
  const std::vector<float> x = Random(s.rows() * s.in, rng);
  const std::vector<float> w = Random(s.groups * s.out * s.in, rng);
  std::vector<float> y(s.rows() * s.out, 0.0f), h(s.rows() * s.rank);
  std::vector<float> merged_y(y.size(), 0.0f);
  for (int g = 0; g < s.groups; ++g) {
    const int lo = s.offsets[g], rows = s.offsets[g + 1] - lo;
    const float* w_g = w.data() + g * s.out * s.in;
    const float* a_g = s.a.data() + g * s.weights.a_group_stride;
    const float* b_g = s.b.data() + g * s.weights.b_group_stride;
    if (rows > 0) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, s.out, s.in, 1.0f,
                  x.data() + lo * s.in, s.in, w_g, s.in, 0.0f, y.data() + lo * s.out, s.out);
    }
    for (int o = 0; o < s.out; ++o) {
      for (int c = 0; c < s.in; ++c) {
        double merged = w_g[o * s.in + c];
        for (int q = 0; q < s.rank; ++q) {
          merged += double{s.weights.scale} * b_g[o * s.rank + q] * a_g[q * s.in + c];
        }
        for (int i = lo; i < lo + rows; ++i) {
          merged_y[i * s.out + o] += static_cast<float>(merged * x[i * s.in + c]);
        }
      }
    }
  }
  GroupedLoraForward(x.data(), s.offsets.data(), s.groups, s.in, s.out, s.weights, h.data(),
                     y.data());
  for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], merged_y[i], 1e-4) << "index " << i;
}

INSTANTIATE_TEST_SUITE_P(AllLayouts, GroupedLoraTest,
                         ::testing::Values(Layout::kPerExpert, Layout::kShared,
                                           Layout::kSharedOuterGateUp, Layout::kSharedOuterDown),
                         [](const ::testing::TestParamInfo<Layout>& info) {
                           switch (info.param) {
                             case Layout::kPerExpert:
                               return "PerExpert";
                             case Layout::kShared:
                               return "Shared";
                             case Layout::kSharedOuterGateUp:
                               return "SharedOuterGateUp";
                             case Layout::kSharedOuterDown:
                               return "SharedOuterDown";
                           }
                           return "Unknown";
                         });

// How the model applies LoRA to an attention projection.
TEST(GroupedLoraSingleGroupTest, MatchesReference) {
  std::mt19937 rng(15);
  LoraSetup s = MakeLora(Layout::kShared, {0, 29}, 33, 17, 4, rng);
  const std::vector<float> x = Random(s.rows() * s.in, rng), dy = Random(s.rows() * s.out, rng);
  std::vector<float> h(s.rows() * s.rank), y(s.rows() * s.out, 0.0f);
  std::vector<float> expected_h = h, expected_y = y;
  GroupedLoraForward(x.data(), s.offsets.data(), 1, s.in, s.out, s.weights, h.data(), y.data());
  reference::GroupedLoraForward(x.data(), s.offsets.data(), 1, s.in, s.out, s.weights,
                                expected_h.data(), expected_y.data());
  EXPECT_TRUE(AllNear(y, expected_y, 1e-5));
  std::vector<float> dx(x.size(), 0.0f), da(s.a.size(), 0.0f), db(s.b.size(), 0.0f);
  std::vector<float> expected_dx = dx, expected_da = da, expected_db = db;
  GroupedLoraBackward(x.data(), s.offsets.data(), 1, s.in, s.out, s.weights, h.data(), dy.data(),
                      dx.data(), da.data(), db.data());
  reference::GroupedLoraBackward(x.data(), s.offsets.data(), 1, s.in, s.out, s.weights, h.data(),
                                 dy.data(), expected_dx.data(), expected_da.data(),
                                 expected_db.data());
  EXPECT_TRUE(AllNear(dx, expected_dx, 1e-5));
  EXPECT_TRUE(AllNear(da, expected_da, 1e-5));
  EXPECT_TRUE(AllNear(db, expected_db, 1e-5));
}

// ---------------------------------------------------------------------------------------------
// The kernels composed as an MoE layer's adapter path, against a per-token loop.

TEST(MoeAdapterPathTest, DispatchLoraCombineEqualsPerTokenComputation) {
  std::mt19937 rng(16);
  const int T = 23, E = 600, k = 8, in = 12, out = 9, rank = 3;
  const std::vector<float> logits = Random(T * E, rng, -2.0f, 2.0f);
  std::vector<float> scores(T * E), gates(T * k);
  std::vector<int16_t> ids(T * k);
  RouterScores(logits.data(), scores.data(), T, E, kernels::ScoringFunction::kSoftmax);
  TopK(scores.data(), nullptr, T, E, k, ids.data());
  GateWeights(scores.data(), ids.data(), T, E, k, /*normalize=*/true, gates.data());
  const ExpertPermutation permutation = BuildPermutation(ids.data(), T, k, E);
  std::vector<int> offsets = permutation.offsets;
  LoraSetup s = MakeLora(Layout::kPerExpert, offsets, in, out, rank, rng);

  const std::vector<float> x = Random(T * in, rng);
  std::vector<float> xp(T * k * in), h(T * k * rank), yp(T * k * out, 0.0f), result(T * out, 0.0f);
  PermuteRows(x.data(), permutation, xp.data(), in);
  GroupedLoraForward(xp.data(), offsets.data(), E, in, out, s.weights, h.data(), yp.data());
  UnpermuteAdd(yp.data(), permutation, gates.data(), result.data(), out);

  for (int t = 0; t < T; ++t) {
    for (int o = 0; o < out; ++o) {
      double expected = 0.0;
      for (int j = 0; j < k; ++j) {
        const int e = ids[t * k + j];
        for (int q = 0; q < rank; ++q) {
          double hq = 0.0;
          for (int c = 0; c < in; ++c) hq += double{x[t * in + c]} * s.a[(e * rank + q) * in + c];
          expected += gates[t * k + j] * s.weights.scale * hq * s.b[(e * out + o) * rank + q];
        }
      }
      ASSERT_NEAR(result[t * out + o], expected, 1e-5) << "token " << t << " out " << o;
    }
  }
}

}  // namespace
}  // namespace tandem::cpu
