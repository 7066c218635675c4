#include "kernels/cpu/int8.h"

#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::cpu {
namespace {

TEST(Int8Test, EachRowKeepsItsAbsmaxAndLandsOnItsOwnGridOf255Levels) {
  std::vector<float> x(2 * 1000);
  for (int c = 0; c < 1000; ++c) {
    x[c] = std::sin(0.37f * c) * 3.0f;          // absmax just under 3
    x[1000 + c] = std::cos(0.11f * c) * 1e-3f;  // another scale entirely
  }
  const std::vector<float> original = x;
  QuantizeRowsToInt8(x.data(), 2, 1000);
  for (int r = 0; r < 2; ++r) {
    float absmax = 0;
    for (int c = 0; c < 1000; ++c) absmax = std::max(absmax, std::abs(original[r * 1000 + c]));
    const float scale = absmax / 127;
    std::set<long> levels;
    for (int c = 0; c < 1000; ++c) {
      const float q = x[r * 1000 + c] / scale;
      EXPECT_NEAR(q, std::round(q), 1e-3) << r << "," << c;  // On the grid.
      EXPECT_LE(std::abs(q), 127.0f + 1e-3f);
      EXPECT_LE(std::abs(x[r * 1000 + c] - original[r * 1000 + c]), scale / 2 * (1 + 1e-5f));
      levels.insert(std::lround(q));
    }
    EXPECT_GT(levels.size(), 200u);  // The row uses most of the 255 levels.
    EXPECT_TRUE(levels.contains(127) || levels.contains(-127));
  }
}

TEST(Int8Test, ExactValuesStayExactAndHalvesRoundToEven) {
  // Scale 1: integers are exact, x.5 rounds to the even neighbour.
  std::vector<float> x = {127, -3, 2.5f, 3.5f, -2.5f, 0};
  QuantizeRowsToInt8(x.data(), 1, static_cast<int64_t>(x.size()));
  EXPECT_EQ(x, (std::vector<float>{127, -3, 2, 4, -2, 0}));
}

TEST(Int8Test, RowsTooSmallToScaleStayAsTheyAre) {
  const float tiny = std::numeric_limits<float>::denorm_min();
  std::vector<float> x = {tiny, -3 * tiny, 0};
  const std::vector<float> original = x;
  QuantizeRowsToInt8(x.data(), 1, 3);
  EXPECT_EQ(x, original);
}

TEST(Int8Test, ZeroRowsStayZeroAndNanStaysNan) {
  std::vector<float> zeros(8, 0.0f);
  QuantizeRowsToInt8(zeros.data(), 2, 4);
  EXPECT_EQ(zeros, std::vector<float>(8, 0.0f));
  std::vector<float> with_nan = {1.0f, std::numeric_limits<float>::quiet_NaN(), -0.5f};
  QuantizeRowsToInt8(with_nan.data(), 1, 3);
  EXPECT_EQ(with_nan[0], 1.0f);
  EXPECT_TRUE(std::isnan(with_nan[1]));
  EXPECT_NEAR(with_nan[2], -64.0f / 127, 1e-7);
}

}  // namespace
}  // namespace tandem::cpu
