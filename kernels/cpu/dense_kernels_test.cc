// Every dense kernel against its naive reference on random inputs with odd sizes, plus central
// finite differences (in double, through the reference forward) for every backward.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/loss.h"
#include "kernels/cpu/reference_dense.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"

namespace tandem::cpu {
namespace {

using Vec = std::vector<float>;
using DVec = std::vector<double>;
using Loss = std::function<double(const DVec&)>;

Vec Random(std::mt19937& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

DVec ToDouble(const Vec& v) { return DVec(v.begin(), v.end()); }

double Dot(const DVec& a, const DVec& b) {
  double sum = 0.0;
  for (size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

// Elementwise |actual - expected| <= atol + rtol |expected|, reporting the worst offender.
::testing::AssertionResult AllClose(const Vec& actual, const Vec& expected, double atol,
                                    double rtol) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "size " << actual.size() << " != expected size " << expected.size();
  }
  int64_t bad = 0, worst = -1;
  double worst_excess = 0.0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double err = std::abs(double{actual[i]} - expected[i]);
    const double excess = err - (atol + rtol * std::abs(expected[i]));
    if (excess > 0.0 || !std::isfinite(actual[i])) {
      ++bad;
      if (worst < 0 || excess > worst_excess || !std::isfinite(actual[i])) {
        worst = static_cast<int64_t>(i);
        worst_excess = excess;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << actual.size() << " elements differ; worst at " << worst << ": "
         << actual[worst] << " vs expected " << expected[worst] << " (atol " << atol << ", rtol "
         << rtol << ")";
}

bool AllFinite(const Vec& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

// Compares an analytic gradient with central differences of a double-precision loss at a random
// subset of coordinates (all of them when there are few).
void ExpectGradientMatches(const char* what, const DVec& point, const Loss& loss, const Vec& grad,
                           std::mt19937& rng, int samples = 24) {
  ASSERT_EQ(point.size(), grad.size()) << what;
  std::vector<size_t> coords(point.size());
  for (size_t i = 0; i < coords.size(); ++i) coords[i] = i;
  std::shuffle(coords.begin(), coords.end(), rng);
  coords.resize(std::min(coords.size(), static_cast<size_t>(samples)));
  constexpr double kStep = 1e-6;
  DVec x = point;
  for (size_t i : coords) {
    x[i] = point[i] + kStep;
    const double up = loss(x);
    x[i] = point[i] - kStep;
    const double down = loss(x);
    x[i] = point[i];
    const double numeric = (up - down) / (2 * kStep);
    EXPECT_NEAR(grad[i], numeric, 2e-4 + 1e-3 * std::abs(numeric)) << what << "[" << i << "]";
  }
}

// ---------------------------------------------------------------------------------------------
// Gemm and Linear

struct GemmCase {
  bool ta, tb;
};

TEST(GemmTest, MatchesReferenceForAllTransposesAndStrides) {
  std::mt19937 rng(1);
  const int m = 37, n = 29, k = 53;
  for (const GemmCase c : {GemmCase{false, false}, GemmCase{false, true}, GemmCase{true, false},
                           GemmCase{true, true}}) {
    SCOPED_TRACE(::testing::Message() << "transpose_a=" << c.ta << " transpose_b=" << c.tb);
    // Padded strides: the kernel must read only op(X)'s elements and write only C's.
    const int a_rows = c.ta ? k : m, a_cols = c.ta ? m : k;
    const int b_rows = c.tb ? n : k, b_cols = c.tb ? k : n;
    const int lda = a_cols + 3, ldb = b_cols + 5, ldc = n + 2;
    const Vec a = Random(rng, static_cast<size_t>(a_rows) * lda);
    const Vec b = Random(rng, static_cast<size_t>(b_rows) * ldb);
    Vec c_fast = Random(rng, static_cast<size_t>(m) * ldc);
    Vec c_ref = c_fast;
    Gemm(c.ta, c.tb, m, n, k, 0.7f, a.data(), lda, b.data(), ldb, -0.3f, c_fast.data(), ldc);
    reference::Gemm(c.ta, c.tb, m, n, k, 0.7, a.data(), lda, b.data(), ldb, -0.3, c_ref.data(),
                    ldc);
    EXPECT_TRUE(AllClose(c_fast, c_ref, 1e-5, 1e-5));
  }
}

TEST(GemmTest, BetaZeroIgnoresGarbageInC) {
  std::mt19937 rng(2);
  const int m = 5, n = 7, k = 3;
  const Vec a = Random(rng, m * k), b = Random(rng, k * n);
  Vec c(m * n, std::numeric_limits<float>::quiet_NaN());
  Vec c_ref(m * n, 0.0f);
  Gemm(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
  reference::Gemm(false, false, m, n, k, 1.0, a.data(), k, b.data(), n, 0.0, c_ref.data(), n);
  EXPECT_TRUE(AllClose(c, c_ref, 1e-6, 1e-6));
}

TEST(GemmTest, EmptyInnerDimensionOnlyScalesC) {
  Vec c = {1.0f, -2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  Gemm(false, false, 2, 3, 0, 1.0f, nullptr, 1, nullptr, 3, 0.5f, c.data(), 3);
  EXPECT_EQ(c, (Vec{0.5f, -1.0f, 1.5f, 2.0f, 2.5f, 3.0f}));
  Gemm(true, true, 2, 3, 0, 1.0f, nullptr, 2, nullptr, 1, 0.0f, c.data(), 3);
  EXPECT_EQ(c, Vec(6, 0.0f));
}

TEST(GemmTest, SetBlasThreadsReturnsPreviousCount) {
  const int original = SetBlasThreads(1);
  EXPECT_GE(original, 1);
  EXPECT_EQ(SetBlasThreads(original), 1);
}

constexpr int kRows = 13, kIn = 37, kOut = 22;

TEST(LinearTest, ForwardMatchesReference) {
  std::mt19937 rng(3);
  const Vec x = Random(rng, kRows * kIn), w = Random(rng, kOut * kIn);
  for (bool accumulate : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "accumulate=" << accumulate);
    Vec y = Random(rng, kRows * kOut);
    Vec y_ref = y;
    Linear(x.data(), w.data(), y.data(), kRows, kIn, kOut, accumulate);
    reference::Linear(x.data(), w.data(), y_ref.data(), kRows, kIn, kOut, accumulate);
    EXPECT_TRUE(AllClose(y, y_ref, 1e-5, 1e-5));
  }
}

TEST(LinearTest, BackwardAccumulatesLikeReference) {
  std::mt19937 rng(4);
  const Vec x = Random(rng, kRows * kIn), w = Random(rng, kOut * kIn);
  const Vec dy = Random(rng, kRows * kOut);
  Vec dx = Random(rng, kRows * kIn), dw = Random(rng, kOut * kIn);
  Vec dx_ref = dx, dw_ref = dw;
  LinearBackward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), kRows, kIn, kOut);
  reference::LinearBackward(x.data(), w.data(), dy.data(), dx_ref.data(), dw_ref.data(), kRows, kIn,
                            kOut);
  EXPECT_TRUE(AllClose(dx, dx_ref, 1e-5, 1e-5));
  EXPECT_TRUE(AllClose(dw, dw_ref, 1e-5, 1e-5));
}

TEST(LinearTest, BackwardSkipsNullOutputs) {
  std::mt19937 rng(5);
  const Vec x = Random(rng, kRows * kIn), w = Random(rng, kOut * kIn);
  const Vec dy = Random(rng, kRows * kOut);
  Vec dx(kRows * kIn), dw(kOut * kIn), dx_ref(kRows * kIn), dw_ref(kOut * kIn);
  LinearBackward(x.data(), w.data(), dy.data(), dx.data(), nullptr, kRows, kIn, kOut);
  LinearBackward(x.data(), w.data(), dy.data(), nullptr, dw.data(), kRows, kIn, kOut);
  reference::LinearBackward(x.data(), w.data(), dy.data(), dx_ref.data(), dw_ref.data(), kRows, kIn,
                            kOut);
  EXPECT_TRUE(AllClose(dx, dx_ref, 1e-5, 1e-5));
  EXPECT_TRUE(AllClose(dw, dw_ref, 1e-5, 1e-5));
}

TEST(LinearTest, GradientMatchesFiniteDifferences) {
  std::mt19937 rng(6);
  const Vec x = Random(rng, kRows * kIn), w = Random(rng, kOut * kIn);
  const Vec dy = Random(rng, kRows * kOut);
  Vec dx(kRows * kIn), dw(kOut * kIn);
  LinearBackward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), kRows, kIn, kOut);
  const DVec xd = ToDouble(x), wd = ToDouble(w), dyd = ToDouble(dy);
  auto loss = [&](const DVec& xs, const DVec& ws) {
    DVec y(kRows * kOut);
    reference::Linear(xs.data(), ws.data(), y.data(), kRows, kIn, kOut);
    return Dot(y, dyd);
  };
  ExpectGradientMatches(
      "dx", xd, [&](const DVec& v) { return loss(v, wd); }, dx, rng);
  ExpectGradientMatches(
      "dw", wd, [&](const DVec& v) { return loss(xd, v); }, dw, rng);
}

// ---------------------------------------------------------------------------------------------
// RmsNorm

constexpr int kNormRows = 9, kNormDim = 37;
constexpr float kNormEps = 1e-5f;

TEST(RmsNormTest, ForwardMatchesReference) {
  std::mt19937 rng(7);
  const Vec x = Random(rng, kNormRows * kNormDim, -2.0f, 2.0f);
  const Vec w = Random(rng, kNormDim, 0.5f, 1.5f);
  Vec y(x.size()), rstd(kNormRows), y_ref(x.size()), rstd_ref(kNormRows);
  RmsNorm(x.data(), w.data(), y.data(), rstd.data(), kNormRows, kNormDim, kNormEps);
  reference::RmsNorm(x.data(), w.data(), y_ref.data(), rstd_ref.data(), kNormRows, kNormDim,
                     kNormEps);
  EXPECT_TRUE(AllClose(y, y_ref, 1e-6, 1e-5));
  EXPECT_TRUE(AllClose(rstd, rstd_ref, 1e-6, 1e-6));
}

TEST(RmsNormTest, BackwardAccumulatesLikeReference) {
  std::mt19937 rng(8);
  const Vec x = Random(rng, kNormRows * kNormDim, -2.0f, 2.0f);
  const Vec w = Random(rng, kNormDim, 0.5f, 1.5f);
  const Vec dy = Random(rng, x.size());
  Vec y(x.size()), rstd(kNormRows);
  RmsNorm(x.data(), w.data(), y.data(), rstd.data(), kNormRows, kNormDim, kNormEps);
  Vec dx = Random(rng, x.size()), dw = Random(rng, kNormDim);
  Vec dx_ref = dx, dw_ref = dw;
  RmsNormBackward(x.data(), w.data(), rstd.data(), dy.data(), dx.data(), dw.data(), kNormRows,
                  kNormDim);
  reference::RmsNormBackward(x.data(), w.data(), rstd.data(), dy.data(), dx_ref.data(),
                             dw_ref.data(), kNormRows, kNormDim);
  EXPECT_TRUE(AllClose(dx, dx_ref, 1e-5, 1e-5));
  EXPECT_TRUE(AllClose(dw, dw_ref, 1e-5, 1e-5));

  Vec dx_only(x.size()), dw_only(kNormDim), dx_zero(x.size()), dw_zero(kNormDim);
  RmsNormBackward(x.data(), w.data(), rstd.data(), dy.data(), dx_only.data(), nullptr, kNormRows,
                  kNormDim);
  RmsNormBackward(x.data(), w.data(), rstd.data(), dy.data(), nullptr, dw_only.data(), kNormRows,
                  kNormDim);
  RmsNormBackward(x.data(), w.data(), rstd.data(), dy.data(), dx_zero.data(), dw_zero.data(),
                  kNormRows, kNormDim);
  EXPECT_EQ(dx_only, dx_zero);
  EXPECT_EQ(dw_only, dw_zero);
}

TEST(RmsNormTest, GradientMatchesFiniteDifferences) {
  std::mt19937 rng(9);
  const Vec x = Random(rng, kNormRows * kNormDim, -2.0f, 2.0f);
  const Vec w = Random(rng, kNormDim, 0.5f, 1.5f);
  const Vec dy = Random(rng, x.size());
  Vec y(x.size()), rstd(kNormRows), dx(x.size()), dw(kNormDim);
  RmsNorm(x.data(), w.data(), y.data(), rstd.data(), kNormRows, kNormDim, kNormEps);
  RmsNormBackward(x.data(), w.data(), rstd.data(), dy.data(), dx.data(), dw.data(), kNormRows,
                  kNormDim);
  const DVec xd = ToDouble(x), wd = ToDouble(w), dyd = ToDouble(dy);
  auto loss = [&](const DVec& xs, const DVec& ws) {
    DVec out(xs.size());
    reference::RmsNorm(xs.data(), ws.data(), out.data(), static_cast<double*>(nullptr), kNormRows,
                       kNormDim, kNormEps);
    return Dot(out, dyd);
  };
  ExpectGradientMatches(
      "dx", xd, [&](const DVec& v) { return loss(v, wd); }, dx, rng);
  ExpectGradientMatches(
      "dweight", wd, [&](const DVec& v) { return loss(xd, v); }, dw, rng);
}

// ---------------------------------------------------------------------------------------------
// Rope

constexpr int kRopeTokens = 11, kRopeHeads = 3, kRopeDim = 18;
constexpr float kTheta = 10000.0f;

std::vector<int> RandomPositions(std::mt19937& rng, int n) {
  std::uniform_int_distribution<int> dist(0, 4095);
  std::vector<int> positions(n);
  for (int& p : positions) p = dist(rng);
  positions[0] = 0;
  return positions;
}

TEST(RopeTest, ForwardMatchesReference) {
  std::mt19937 rng(10);
  const std::vector<int> pos = RandomPositions(rng, kRopeTokens);
  const Vec x = Random(rng, kRopeTokens * kRopeHeads * kRopeDim);
  Vec y = x, y_ref = x;
  Rope(y.data(), pos.data(), kRopeTokens, kRopeHeads, kRopeDim, kTheta);
  reference::Rope(y_ref.data(), pos.data(), kRopeTokens, kRopeHeads, kRopeDim, kTheta);
  EXPECT_TRUE(AllClose(y, y_ref, 1e-6, 1e-5));
  // Position 0 is the identity.
  EXPECT_EQ(Vec(y.begin(), y.begin() + kRopeHeads * kRopeDim),
            Vec(x.begin(), x.begin() + kRopeHeads * kRopeDim));
}

// Pins the rotate-half convention by hand rather than through the reference: head_dim 4 pairs
// (0, 2) at frequency 1 and (1, 3) at frequency theta^(-1/2) = 0.01.
TEST(RopeTest, UsesRotateHalfPairs) {
  Vec x = {1.0f, 2.0f, 3.0f, 4.0f};
  const int position = 1;
  Rope(x.data(), &position, 1, 1, 4, kTheta);
  const double c0 = std::cos(1.0), s0 = std::sin(1.0), c1 = std::cos(0.01), s1 = std::sin(0.01);
  EXPECT_NEAR(x[0], 1 * c0 - 3 * s0, 1e-6);
  EXPECT_NEAR(x[2], 3 * c0 + 1 * s0, 1e-6);
  EXPECT_NEAR(x[1], 2 * c1 - 4 * s1, 1e-6);
  EXPECT_NEAR(x[3], 4 * c1 + 2 * s1, 1e-6);
}

TEST(RopeTest, BackwardInvertsForwardAndMatchesReference) {
  std::mt19937 rng(11);
  const std::vector<int> pos = RandomPositions(rng, kRopeTokens);
  const Vec x = Random(rng, kRopeTokens * kRopeHeads * kRopeDim);
  Vec roundtrip = x;
  Rope(roundtrip.data(), pos.data(), kRopeTokens, kRopeHeads, kRopeDim, kTheta);
  RopeBackward(roundtrip.data(), pos.data(), kRopeTokens, kRopeHeads, kRopeDim, kTheta);
  EXPECT_TRUE(AllClose(roundtrip, x, 1e-6, 1e-5));

  Vec dx = x, dx_ref = x;
  RopeBackward(dx.data(), pos.data(), kRopeTokens, kRopeHeads, kRopeDim, kTheta);
  reference::RopeBackward(dx_ref.data(), pos.data(), kRopeTokens, kRopeHeads, kRopeDim, kTheta);
  EXPECT_TRUE(AllClose(dx, dx_ref, 1e-6, 1e-5));
}

TEST(RopeTest, GradientMatchesFiniteDifferences) {
  std::mt19937 rng(12);
  const std::vector<int> pos = RandomPositions(rng, kRopeTokens);
  const Vec x = Random(rng, kRopeTokens * kRopeHeads * kRopeDim);
  const Vec dy = Random(rng, x.size());
  Vec dx = dy;
  RopeBackward(dx.data(), pos.data(), kRopeTokens, kRopeHeads, kRopeDim, kTheta);
  const DVec dyd = ToDouble(dy);
  auto loss = [&](const DVec& xs) {
    DVec y = xs;
    reference::Rope(y.data(), pos.data(), kRopeTokens, kRopeHeads, kRopeDim, kTheta);
    return Dot(y, dyd);
  };
  ExpectGradientMatches("dx", ToDouble(x), loss, dx, rng);
}

// ---------------------------------------------------------------------------------------------
// Attention

constexpr int kT = 23, kH = 4, kD = 12;
// Key/value heads: multi-head (kH), grouped-query and multi-query attention.
constexpr int kKvHeads[] = {kH, 2, 1};

struct Qkv {
  Vec q, k, v;
};

Qkv RandomQkv(std::mt19937& rng, int T, int H, int KV, int D, float range = 1.0f) {
  const size_t nq = static_cast<size_t>(T) * H * D, nkv = static_cast<size_t>(T) * KV * D;
  return {Random(rng, nq, -range, range), Random(rng, nkv, -range, range),
          Random(rng, nkv, -range, range)};
}

// [T, KV, D] -> [T, H, D], each key/value head copied to the query heads of its group.
Vec RepeatHeads(const Vec& x, int T, int H, int KV, int D) {
  Vec repeated(static_cast<size_t>(T) * H * D);
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < H; ++h) {
      std::copy_n(x.data() + (t * KV + h / (H / KV)) * D, D, repeated.data() + (t * H + h) * D);
    }
  }
  return repeated;
}

TEST(AttentionTest, ForwardMatchesReference) {
  std::mt19937 rng(13);
  for (const int kv : kKvHeads) {
    SCOPED_TRACE(::testing::Message() << "KV=" << kv);
    const Qkv in = RandomQkv(rng, kT, kH, kv, kD, 2.0f);
    Vec out(kT * kH * kD), probs(kH * kT * kT), out_ref(out.size()), probs_ref(probs.size());
    CausalAttention(in.q.data(), in.k.data(), in.v.data(), out.data(), probs.data(), kT, kH, kv,
                    kD);
    reference::CausalAttention(in.q.data(), in.k.data(), in.v.data(), out_ref.data(),
                               probs_ref.data(), kT, kH, kv, kD);
    EXPECT_TRUE(AllClose(out, out_ref, 1e-6, 1e-5));
    EXPECT_TRUE(AllClose(probs, probs_ref, 1e-6, 1e-5));
    for (int h = 0; h < kH; ++h) {
      for (int t = 0; t < kT; ++t) {
        const float* row = probs.data() + (h * kT + t) * kT;
        double sum = 0.0;
        for (int j = 0; j < kT; ++j) {
          sum += row[j];
          if (j > t) {
            EXPECT_EQ(row[j], 0.0f) << "h=" << h << " t=" << t << " j=" << j;
          }
        }
        EXPECT_NEAR(sum, 1.0, 1e-5) << "h=" << h << " t=" << t;
      }
    }
  }
}

// Grouped-query attention is multi-head attention over keys and values repeated per group
// (how transformers' repeat_kv computes it).
TEST(AttentionTest, GroupedQueriesEqualRepeatedKeysAndValues) {
  std::mt19937 rng(19);
  const int kv = 2;
  const Qkv in = RandomQkv(rng, kT, kH, kv, kD, 2.0f);
  const Vec k = RepeatHeads(in.k, kT, kH, kv, kD), v = RepeatHeads(in.v, kT, kH, kv, kD);
  const size_t n = static_cast<size_t>(kT) * kH * kD;
  Vec grouped(n), repeated(n), probs(kH * kT * kT);
  CausalAttention(in.q.data(), in.k.data(), in.v.data(), grouped.data(), probs.data(), kT, kH, kv,
                  kD);
  CausalAttention(in.q.data(), k.data(), v.data(), repeated.data(), probs.data(), kT, kH, kH, kD);
  EXPECT_EQ(grouped, repeated);
  // The gradient of a shared head is the sum over its group.
  const Vec dout = Random(rng, n);
  Vec dk(in.k.size()), dv(in.v.size()), dk_repeated(n), dv_repeated(n);
  CausalAttentionBackward(in.q.data(), in.k.data(), in.v.data(), probs.data(), dout.data(), nullptr,
                          dk.data(), dv.data(), kT, kH, kv, kD);
  CausalAttentionBackward(in.q.data(), k.data(), v.data(), probs.data(), dout.data(), nullptr,
                          dk_repeated.data(), dv_repeated.data(), kT, kH, kH, kD);
  Vec dk_summed(dk.size(), 0.0f), dv_summed(dv.size(), 0.0f);
  for (int t = 0; t < kT; ++t) {
    for (int h = 0; h < kH; ++h) {
      for (int d = 0; d < kD; ++d) {
        dk_summed[(t * kv + h / (kH / kv)) * kD + d] += dk_repeated[(t * kH + h) * kD + d];
        dv_summed[(t * kv + h / (kH / kv)) * kD + d] += dv_repeated[(t * kH + h) * kD + d];
      }
    }
  }
  EXPECT_TRUE(AllClose(dk, dk_summed, 1e-5, 1e-5));
  EXPECT_TRUE(AllClose(dv, dv_summed, 1e-5, 1e-5));
}

// Keys wider than values and a scale of its own (DeepSeek's latent attention) equal standard
// attention over values zero-padded to the key width, with queries pre-scaled.
TEST(AttentionTest, WideKeysAndAScaleEqualPaddedStandardAttention) {
  std::mt19937 rng(20);
  const int H = 4, KV = 2, Dqk = 12, Dv = 5;
  const kernels::AttentionShape shape{
      .heads = H, .kv_heads = KV, .qk_dim = Dqk, .v_dim = Dv, .scale = 0.3f};
  const Qkv in = RandomQkv(rng, kT, H, KV, Dqk, 2.0f);
  const Vec v = Random(rng, kT * KV * Dv);
  Vec padded(in.k.size(), 0.0f), q_scaled = in.q;
  for (int i = 0; i < kT * KV; ++i) std::copy_n(v.data() + i * Dv, Dv, padded.data() + i * Dqk);
  for (float& x : q_scaled) x *= 0.3f * std::sqrt(static_cast<float>(Dqk));
  Vec out(kT * H * Dv), probs(H * kT * kT), wide(kT * H * Dqk), wide_probs(probs.size());
  CausalAttention(in.q.data(), in.k.data(), v.data(), out.data(), probs.data(), kT, shape);
  CausalAttention(q_scaled.data(), in.k.data(), padded.data(), wide.data(), wide_probs.data(), kT,
                  H, KV, Dqk);
  EXPECT_TRUE(AllClose(probs, wide_probs, 1e-5, 1e-5));
  for (int i = 0; i < kT * H; ++i) {
    EXPECT_TRUE(AllClose(Vec(out.begin() + i * Dv, out.begin() + (i + 1) * Dv),
                         Vec(wide.begin() + i * Dqk, wide.begin() + i * Dqk + Dv), 1e-5, 1e-5));
  }
  // Gradients: dk and dv (first Dv of the padded) agree; dq agrees up to the pre-scaling.
  const Vec dout = Random(rng, out.size());
  Vec dout_wide(wide.size(), 0.0f);
  for (int i = 0; i < kT * H; ++i) std::copy_n(dout.data() + i * Dv, Dv, dout_wide.data() + i * Dqk);
  Vec dq(in.q.size()), dk(in.k.size()), dv(v.size()), dq_w(in.q.size()), dk_w(in.k.size()),
      dv_w(padded.size());
  CausalAttentionBackward(in.q.data(), in.k.data(), v.data(), probs.data(), dout.data(), dq.data(),
                          dk.data(), dv.data(), kT, shape);
  CausalAttentionBackward(q_scaled.data(), in.k.data(), padded.data(), wide_probs.data(),
                          dout_wide.data(), dq_w.data(), dk_w.data(), dv_w.data(), kT, H, KV, Dqk);
  for (float& x : dq_w) x *= 0.3f * std::sqrt(static_cast<float>(Dqk));
  EXPECT_TRUE(AllClose(dq, dq_w, 1e-4, 1e-4));
  EXPECT_TRUE(AllClose(dk, dk_w, 1e-4, 1e-4));
  for (int i = 0; i < kT * KV; ++i) {
    EXPECT_TRUE(AllClose(Vec(dv.begin() + i * Dv, dv.begin() + (i + 1) * Dv),
                         Vec(dv_w.begin() + i * Dqk, dv_w.begin() + i * Dqk + Dv), 1e-5, 1e-5));
  }
  // Decode of the last row equals its full-sequence row.
  Vec decoded(H * Dv), scratch(kT);
  DecodeAttention(in.q.data() + (kT - 1) * H * Dqk, in.k.data(), v.data(), kT, decoded.data(),
                  shape, scratch.data());
  EXPECT_TRUE(AllClose(decoded, Vec(out.end() - H * Dv, out.end()), 1e-5, 1e-5));
}

TEST(AttentionTest, BackwardAccumulatesLikeReference) {
  std::mt19937 rng(14);
  for (const int kv : kKvHeads) {
    SCOPED_TRACE(::testing::Message() << "KV=" << kv);
    const Qkv in = RandomQkv(rng, kT, kH, kv, kD, 2.0f);
    const size_t n = static_cast<size_t>(kT) * kH * kD, nkv = in.k.size();
    const Vec dout = Random(rng, n);
    Vec out(n), probs(kH * kT * kT);
    CausalAttention(in.q.data(), in.k.data(), in.v.data(), out.data(), probs.data(), kT, kH, kv,
                    kD);
    Vec dq = Random(rng, n), dk = Random(rng, nkv), dv = Random(rng, nkv);
    Vec dq_ref = dq, dk_ref = dk, dv_ref = dv;
    CausalAttentionBackward(in.q.data(), in.k.data(), in.v.data(), probs.data(), dout.data(),
                            dq.data(), dk.data(), dv.data(), kT, kH, kv, kD);
    reference::CausalAttentionBackward(in.q.data(), in.k.data(), in.v.data(), probs.data(),
                                       dout.data(), dq_ref.data(), dk_ref.data(), dv_ref.data(), kT,
                                       kH, kv, kD);
    EXPECT_TRUE(AllClose(dq, dq_ref, 1e-5, 1e-5));
    EXPECT_TRUE(AllClose(dk, dk_ref, 1e-5, 1e-5));
    EXPECT_TRUE(AllClose(dv, dv_ref, 1e-5, 1e-5));

    // Each output alone equals its share of the all-outputs call.
    Vec all_q(n), all_k(nkv), all_v(nkv), only_q(n), only_k(nkv), only_v(nkv);
    auto backward = [&](float* q_grad, float* k_grad, float* v_grad) {
      CausalAttentionBackward(in.q.data(), in.k.data(), in.v.data(), probs.data(), dout.data(),
                              q_grad, k_grad, v_grad, kT, kH, kv, kD);
    };
    backward(all_q.data(), all_k.data(), all_v.data());
    backward(only_q.data(), nullptr, nullptr);
    backward(nullptr, only_k.data(), nullptr);
    backward(nullptr, nullptr, only_v.data());
    EXPECT_EQ(only_q, all_q);
    EXPECT_EQ(only_k, all_k);
    EXPECT_EQ(only_v, all_v);
  }
}

TEST(AttentionTest, GradientMatchesFiniteDifferences) {
  std::mt19937 rng(15);
  for (const int kv : {kH, 2}) {
    SCOPED_TRACE(::testing::Message() << "KV=" << kv);
    const Qkv in = RandomQkv(rng, kT, kH, kv, kD, 2.0f);
    const size_t n = static_cast<size_t>(kT) * kH * kD, nkv = in.k.size();
    const Vec dout = Random(rng, n);
    Vec out(n), probs(kH * kT * kT), dq(n), dk(nkv), dv(nkv);
    CausalAttention(in.q.data(), in.k.data(), in.v.data(), out.data(), probs.data(), kT, kH, kv,
                    kD);
    CausalAttentionBackward(in.q.data(), in.k.data(), in.v.data(), probs.data(), dout.data(),
                            dq.data(), dk.data(), dv.data(), kT, kH, kv, kD);
    const DVec qd = ToDouble(in.q), kd = ToDouble(in.k), vd = ToDouble(in.v);
    const DVec doutd = ToDouble(dout);
    auto loss = [&](const DVec& qs, const DVec& ks, const DVec& vs) {
      DVec o(n), p(kH * kT * kT);
      reference::CausalAttention(qs.data(), ks.data(), vs.data(), o.data(), p.data(), kT, kH, kv,
                                 kD);
      return Dot(o, doutd);
    };
    ExpectGradientMatches(
        "dq", qd, [&](const DVec& x) { return loss(x, kd, vd); }, dq, rng, 40);
    ExpectGradientMatches(
        "dk", kd, [&](const DVec& x) { return loss(qd, x, vd); }, dk, rng, 40);
    ExpectGradientMatches(
        "dv", vd, [&](const DVec& x) { return loss(qd, kd, x); }, dv, rng, 40);
  }
}

// The model's "KV-cache decode equals full forward" test rests on this.
TEST(AttentionTest, DecodeEqualsCausalRow) {
  std::mt19937 rng(16);
  for (const auto [D, KV] : {std::pair{16, 3}, std::pair{32, 3}, std::pair{16, 1}}) {
    const int T = 37, H = 3;
    SCOPED_TRACE(::testing::Message() << "D=" << D << " KV=" << KV);
    const Qkv in = RandomQkv(rng, T, H, KV, D, 2.0f);
    const int row = H * D;
    Vec out(T * row), probs(H * T * T), decoded(row), decoded_ref(row), scratch(T);
    Vec scratch_ref(T);
    CausalAttention(in.q.data(), in.k.data(), in.v.data(), out.data(), probs.data(), T, H, KV, D);
    float max_diff = 0.0f;
    for (int t = 0; t < T; ++t) {
      const float* q = in.q.data() + t * row;
      DecodeAttention(q, in.k.data(), in.v.data(), t + 1, decoded.data(), H, KV, D, scratch.data());
      reference::DecodeAttention(q, in.k.data(), in.v.data(), t + 1, decoded_ref.data(), H, KV, D,
                                 scratch_ref.data());
      const Vec full(out.begin() + t * row, out.begin() + (t + 1) * row);
      EXPECT_TRUE(AllClose(decoded, full, 1e-5, 0.0)) << "t=" << t;
      EXPECT_TRUE(AllClose(decoded, decoded_ref, 1e-6, 1e-5)) << "t=" << t;
      for (int i = 0; i < row; ++i) max_diff = std::max(max_diff, std::abs(decoded[i] - full[i]));
    }
    std::ostringstream diff;
    diff << max_diff;
    RecordProperty("max_decode_vs_full_diff_D" + std::to_string(D) + "_KV" + std::to_string(KV),
                   diff.str());
  }
}

TEST(AttentionTest, LargeScoresStayFinite) {
  std::mt19937 rng(17);
  const Qkv in = RandomQkv(rng, kT, kH, kH, kD, 100.0f);
  const size_t n = static_cast<size_t>(kT) * kH * kD;
  Vec out(n), probs(kH * kT * kT), dq(n), dk(n), dv(n), scratch(kT), decoded(kH * kD);
  const Vec dout = Random(rng, n);
  CausalAttention(in.q.data(), in.k.data(), in.v.data(), out.data(), probs.data(), kT, kH, kH, kD);
  CausalAttentionBackward(in.q.data(), in.k.data(), in.v.data(), probs.data(), dout.data(),
                          dq.data(), dk.data(), dv.data(), kT, kH, kH, kD);
  DecodeAttention(in.q.data() + (kT - 1) * kH * kD, in.k.data(), in.v.data(), kT, decoded.data(),
                  kH, kH, kD, scratch.data());
  EXPECT_TRUE(AllFinite(out));
  EXPECT_TRUE(AllFinite(probs));
  EXPECT_TRUE(AllFinite(dq));
  EXPECT_TRUE(AllFinite(dk));
  EXPECT_TRUE(AllFinite(dv));
  EXPECT_TRUE(AllFinite(decoded));
}

// ---------------------------------------------------------------------------------------------
// SwiGlu

constexpr int64_t kSwiGluN = 1001;

TEST(SwiGluTest, ForwardMatchesReference) {
  std::mt19937 rng(18);
  const Vec gate = Random(rng, kSwiGluN, -6.0f, 6.0f), up = Random(rng, kSwiGluN, -2.0f, 2.0f);
  Vec out(kSwiGluN), out_ref(kSwiGluN);
  SwiGlu(gate.data(), up.data(), out.data(), kSwiGluN);
  reference::SwiGlu(gate.data(), up.data(), out_ref.data(), kSwiGluN);
  EXPECT_TRUE(AllClose(out, out_ref, 1e-6, 1e-5));
}

TEST(SwiGluTest, BackwardAccumulatesLikeReference) {
  std::mt19937 rng(19);
  const Vec gate = Random(rng, kSwiGluN, -6.0f, 6.0f), up = Random(rng, kSwiGluN, -2.0f, 2.0f);
  const Vec dout = Random(rng, kSwiGluN);
  Vec dgate = Random(rng, kSwiGluN), dup = Random(rng, kSwiGluN);
  Vec dgate_ref = dgate, dup_ref = dup;
  SwiGluBackward(gate.data(), up.data(), dout.data(), dgate.data(), dup.data(), kSwiGluN);
  reference::SwiGluBackward(gate.data(), up.data(), dout.data(), dgate_ref.data(), dup_ref.data(),
                            kSwiGluN);
  EXPECT_TRUE(AllClose(dgate, dgate_ref, 1e-6, 1e-5));
  EXPECT_TRUE(AllClose(dup, dup_ref, 1e-6, 1e-5));

  Vec only_gate(kSwiGluN), only_up(kSwiGluN), both_gate(kSwiGluN), both_up(kSwiGluN);
  SwiGluBackward(gate.data(), up.data(), dout.data(), only_gate.data(), nullptr, kSwiGluN);
  SwiGluBackward(gate.data(), up.data(), dout.data(), nullptr, only_up.data(), kSwiGluN);
  SwiGluBackward(gate.data(), up.data(), dout.data(), both_gate.data(), both_up.data(), kSwiGluN);
  EXPECT_EQ(only_gate, both_gate);
  EXPECT_EQ(only_up, both_up);
}

TEST(SwiGluTest, GradientMatchesFiniteDifferences) {
  std::mt19937 rng(20);
  const int64_t n = 101;
  const Vec gate = Random(rng, n, -6.0f, 6.0f), up = Random(rng, n, -2.0f, 2.0f);
  const Vec dout = Random(rng, n);
  Vec dgate(n), dup(n);
  SwiGluBackward(gate.data(), up.data(), dout.data(), dgate.data(), dup.data(), n);
  const DVec gd = ToDouble(gate), ud = ToDouble(up), doutd = ToDouble(dout);
  auto loss = [&](const DVec& g, const DVec& u) {
    DVec out(n);
    reference::SwiGlu(g.data(), u.data(), out.data(), n);
    return Dot(out, doutd);
  };
  ExpectGradientMatches(
      "dgate", gd, [&](const DVec& x) { return loss(x, ud); }, dgate, rng);
  ExpectGradientMatches(
      "dup", ud, [&](const DVec& x) { return loss(gd, x); }, dup, rng);
}

TEST(SwiGluTest, ExtremeGatesStayFinite) {
  const Vec gate = {-1000.0f, -100.0f, 100.0f, 1000.0f}, up(4, 1.0f), dout(4, 1.0f);
  Vec out(4), dgate(4), dup(4);
  SwiGlu(gate.data(), up.data(), out.data(), 4);
  SwiGluBackward(gate.data(), up.data(), dout.data(), dgate.data(), dup.data(), 4);
  EXPECT_TRUE(AllFinite(out));
  EXPECT_TRUE(AllFinite(dgate));
  EXPECT_TRUE(AllFinite(dup));
  EXPECT_NEAR(out[0], 0.0f, 1e-30);
  EXPECT_FLOAT_EQ(out[3], 1000.0f);
  EXPECT_FLOAT_EQ(dgate[3], 1.0f);
}

// ---------------------------------------------------------------------------------------------
// Loss

constexpr int kLossRows = 7, kVocab = 53;

std::vector<int> RandomTargets(std::mt19937& rng, int rows, int vocab) {
  std::uniform_int_distribution<int> dist(0, vocab - 1);
  std::vector<int> targets(rows);
  for (int& t : targets) t = dist(rng);
  return targets;
}

TEST(LossTest, LogSoftmaxMatchesReferenceAndNormalizes) {
  std::mt19937 rng(21);
  const Vec logits = Random(rng, kLossRows * kVocab, -8.0f, 8.0f);
  Vec logp(logits.size()), logp_ref(logits.size());
  LogSoftmax(logits.data(), logp.data(), kLossRows, kVocab);
  reference::LogSoftmax(logits.data(), logp_ref.data(), kLossRows, kVocab);
  EXPECT_TRUE(AllClose(logp, logp_ref, 1e-5, 1e-6));
  for (int r = 0; r < kLossRows; ++r) {
    double sum = 0.0;
    for (int j = 0; j < kVocab; ++j) sum += std::exp(double{logp[r * kVocab + j]});
    EXPECT_NEAR(sum, 1.0, 1e-5) << "row " << r;
  }
}

TEST(LossTest, TokenLogProbsMatchesReference) {
  std::mt19937 rng(22);
  const Vec logits = Random(rng, kLossRows * kVocab, -8.0f, 8.0f);
  const std::vector<int> targets = RandomTargets(rng, kLossRows, kVocab);
  Vec out(kLossRows), lse(kLossRows), out_ref(kLossRows), lse_ref(kLossRows), logp(logits.size());
  TokenLogProbs(logits.data(), targets.data(), out.data(), lse.data(), kLossRows, kVocab);
  reference::TokenLogProbs(logits.data(), targets.data(), out_ref.data(), lse_ref.data(), kLossRows,
                           kVocab);
  EXPECT_TRUE(AllClose(out, out_ref, 1e-5, 1e-6));
  EXPECT_TRUE(AllClose(lse, lse_ref, 1e-5, 1e-6));
  // Agrees with LogSoftmax, and lse may be omitted.
  Vec out_no_lse(kLossRows);
  TokenLogProbs(logits.data(), targets.data(), out_no_lse.data(), nullptr, kLossRows, kVocab);
  EXPECT_EQ(out_no_lse, out);
  LogSoftmax(logits.data(), logp.data(), kLossRows, kVocab);
  for (int r = 0; r < kLossRows; ++r) EXPECT_EQ(out[r], logp[r * kVocab + targets[r]]);
}

TEST(LossTest, BackwardAccumulatesLikeReference) {
  std::mt19937 rng(23);
  const Vec logits = Random(rng, kLossRows * kVocab, -8.0f, 8.0f);
  const std::vector<int> targets = RandomTargets(rng, kLossRows, kVocab);
  Vec dlogprob = Random(rng, kLossRows);
  dlogprob[2] = 0.0f;  // A masked token: its row must stay as it was.
  Vec dlogits = Random(rng, logits.size());
  Vec dlogits_ref = dlogits;
  TokenLogProbsBackward(logits.data(), targets.data(), dlogprob.data(), dlogits.data(), kLossRows,
                        kVocab);
  reference::TokenLogProbsBackward(logits.data(), targets.data(), dlogprob.data(),
                                   dlogits_ref.data(), kLossRows, kVocab);
  EXPECT_TRUE(AllClose(dlogits, dlogits_ref, 1e-6, 1e-5));
}

TEST(LossTest, GradientMatchesFiniteDifferences) {
  std::mt19937 rng(24);
  const Vec logits = Random(rng, kLossRows * kVocab, -8.0f, 8.0f);
  const std::vector<int> targets = RandomTargets(rng, kLossRows, kVocab);
  const Vec dlogprob = Random(rng, kLossRows);
  Vec dlogits(logits.size());
  TokenLogProbsBackward(logits.data(), targets.data(), dlogprob.data(), dlogits.data(), kLossRows,
                        kVocab);
  const DVec dlogprobd = ToDouble(dlogprob);
  auto loss = [&](const DVec& x) {
    DVec out(kLossRows);
    reference::TokenLogProbs(x.data(), targets.data(), out.data(), static_cast<double*>(nullptr),
                             kLossRows, kVocab);
    return Dot(out, dlogprobd);
  };
  // Include every target coordinate, where the indicator term lives.
  DVec point = ToDouble(logits);
  ExpectGradientMatches("dlogits", point, loss, dlogits, rng, 60);
  for (int r = 0; r < kLossRows; ++r) {
    const size_t i = static_cast<size_t>(r) * kVocab + targets[r];
    DVec x = point;
    x[i] += 1e-6;
    const double up = loss(x);
    x[i] -= 2e-6;
    const double numeric = (up - loss(x)) / 2e-6;
    EXPECT_NEAR(dlogits[i], numeric, 2e-4 + 1e-3 * std::abs(numeric)) << "target of row " << r;
  }
}

TEST(LossTest, LargeLogitsStayFinite) {
  std::mt19937 rng(25);
  const Vec logits = Random(rng, kLossRows * kVocab, -1e4f, 1e4f);
  const std::vector<int> targets = RandomTargets(rng, kLossRows, kVocab);
  Vec logp(logits.size()), logp_ref(logits.size()), out(kLossRows), lse(kLossRows);
  LogSoftmax(logits.data(), logp.data(), kLossRows, kVocab);
  reference::LogSoftmax(logits.data(), logp_ref.data(), kLossRows, kVocab);
  TokenLogProbs(logits.data(), targets.data(), out.data(), lse.data(), kLossRows, kVocab);
  const Vec dlogprob(kLossRows, 1.0f);
  Vec dlogits(logits.size());
  TokenLogProbsBackward(logits.data(), targets.data(), dlogprob.data(), dlogits.data(), kLossRows,
                        kVocab);
  EXPECT_TRUE(AllFinite(logp));
  EXPECT_TRUE(AllFinite(out));
  EXPECT_TRUE(AllFinite(lse));
  EXPECT_TRUE(AllFinite(dlogits));
  // At this scale a float ulp is ~1e-3, so agreement is to a few ulps of the logits.
  EXPECT_TRUE(AllClose(logp, logp_ref, 4e-3, 1e-6));
  for (int r = 0; r < kLossRows; ++r) {
    EXPECT_LE(out[r], 0.0f);
    double row_sum = 0.0;
    for (int j = 0; j < kVocab; ++j) row_sum += dlogits[r * kVocab + j];
    EXPECT_NEAR(row_sum, 0.0, 1e-5) << "row " << r;  // Σ_j (1[j=t] - p_j) = 0.
  }
}

}  // namespace
}  // namespace tandem::cpu
