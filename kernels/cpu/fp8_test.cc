#include "kernels/cpu/fp8.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::cpu {
namespace {

// Every finite E4M3 value, decoded from its bit fields (sign, 4 exponent bits with bias 7,
// 3 mantissa bits; exponent 0 subnormal; S.1111.111 is NaN), in increasing order.
std::vector<float> FiniteE4M3Values() {
  std::vector<float> values;
  for (int code = 0; code < 128; ++code) {
    const int exponent = code >> 3, mantissa = code & 7;
    if (exponent == 15 && mantissa == 7) continue;  // NaN.
    const float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                          : std::ldexp(1.0f + mantissa / 8.0f, exponent - 7);
    values.push_back(magnitude);
  }
  std::vector<float> all;
  for (auto it = values.rbegin(); it != values.rend(); ++it) {
    if (*it != 0.0f) all.push_back(-*it);
  }
  all.insert(all.end(), values.begin(), values.end());
  return all;
}

TEST(Fp8Test, EveryE4M3ValueIsItsOwnRounding) {
  const std::vector<float> values = FiniteE4M3Values();
  EXPECT_EQ(values.size(), 253u);  // 254 finite codes, +0 and -0 counted once.
  EXPECT_EQ(values.back(), 448.0f);
  for (float value : values) EXPECT_EQ(RoundToE4M3(value), value);
}

TEST(Fp8Test, MidpointsRoundToTheEvenNeighbourAndOthersToTheNearest) {
  const std::vector<float> values = FiniteE4M3Values();
  for (size_t i = 0; i + 1 < values.size(); ++i) {
    const float low = values[i], high = values[i + 1];
    const float middle = (low + high) / 2;  // Exact in float.
    // The even neighbour has an even mantissa code; with 8 codes per binade, that is every
    // other value counted from zero.
    const auto code_of = [](float v) {
      const float a = std::fabs(v);
      int exponent = 0;
      std::frexp(a, &exponent);
      return a < 0x1p-6f ? static_cast<int>(a / 0x1p-9f)
                         : static_cast<int>(std::ldexp(a, 4 - exponent)) & 7;
    };
    const float even = code_of(low) % 2 == 0 ? low : high;
    EXPECT_EQ(RoundToE4M3(middle), even) << low << " .. " << high;
    EXPECT_EQ(RoundToE4M3(std::nextafter(middle, low)), low);
    EXPECT_EQ(RoundToE4M3(std::nextafter(middle, high)), high);
  }
}

TEST(Fp8Test, LargeValuesSaturateTinyOnesFlushAndNanStays) {
  EXPECT_EQ(RoundToE4M3(1e6f), 448.0f);
  EXPECT_EQ(RoundToE4M3(-460.0f), -448.0f);
  EXPECT_EQ(RoundToE4M3(0x1p-11f), 0.0f);  // Below half the smallest subnormal 2^-9.
  EXPECT_EQ(RoundToE4M3(0x1p-10f + 0x1p-20f), 0x1p-9f);
  EXPECT_TRUE(std::isnan(RoundToE4M3(std::nanf(""))));
}

TEST(Fp8Test, RowsGetTheirOwnScales) {
  std::vector<float> rows = {1.0f,
                             -2.0f,
                             0.5f,
                             /*row 2*/ 0.0f,
                             0.0f,
                             0.0f,
                             /*row 3*/ 1000.0f,
                             3.0f,
                             -0.001f};
  QuantizeRowsToE4M3(rows.data(), 3, 3);
  EXPECT_EQ(rows[1], -2.0f) << "the absmax of a row maps to 448 and back exactly";
  EXPECT_EQ(rows[0], 1.0f);
  EXPECT_EQ(rows[3], 0.0f);
  EXPECT_EQ(rows[6], 1000.0f);
  EXPECT_NEAR(rows[7], 3.0f, 3.0f / 16);  // Three mantissa bits: relative error up to 1/16.
  EXPECT_EQ(rows[8], 0.0f) << "1e-6 of the absmax is below E4M3's range";
}

TEST(Fp8Test, RowsTooSmallToScaleStayAsTheyAre) {
  const float tiny = std::numeric_limits<float>::denorm_min();
  std::vector<float> row = {tiny, -3 * tiny, 0};
  const std::vector<float> original = row;
  QuantizeRowsToE4M3(row.data(), 1, 3);
  EXPECT_EQ(row, original);
}

}  // namespace
}  // namespace tandem::cpu
