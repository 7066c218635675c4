#include "kernels/cuda/elementwise.h"

#include <bit>

#include "common/dtype.h"
#include "kernels/cuda/testing.h"

namespace tandem::cuda {
namespace {

class ElementwiseTest : public CudaTest {};

TEST_F(ElementwiseTest, AddAndScaleAreExact) {
  constexpr int64_t kN = 300'007;
  const std::vector<float> x = RandomFloats(kN, 141), y = RandomFloats(kN, 142);
  std::vector<float> expected(kN);
  for (int64_t i = 0; i < kN; ++i) expected[i] = (y[i] + x[i]) * 2.5f;
  DeviceArray<float> x_d = Upload(x), y_d = Upload(y);
  ASSERT_TRUE(AddInPlace(x_d.data(), y_d.data(), kN).ok());
  ASSERT_TRUE(ScaleInPlace(y_d.data(), 2.5f, kN).ok());
  EXPECT_EQ(Download(y_d), expected);  // One rounding per operation on both sides.
  EXPECT_TRUE(AddInPlace(nullptr, nullptr, 0).ok());
}

// Every bit pattern of a float's upper half with a few lower halves, including ties, infinities,
// NaNs and denormals, against the host's conversion.
TEST_F(ElementwiseTest, RoundToBf16MatchesTheHostBitForBit) {
  std::vector<float> values;
  for (uint32_t high = 0; high < 0x10000; ++high) {
    for (const uint32_t low : {0x0000u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      values.push_back(std::bit_cast<float>((high << 16) | low));
    }
  }
  std::vector<uint32_t> expected;
  for (const float value : values) {
    expected.push_back(std::bit_cast<uint32_t>(ToFloat(ToBFloat16(value))));
  }
  DeviceArray<float> values_d = Upload(values);
  ASSERT_TRUE(RoundToBf16(values_d.data(), values.size()).ok());
  std::vector<uint32_t> actual;
  for (const float value : Download(values_d)) actual.push_back(std::bit_cast<uint32_t>(value));
  EXPECT_EQ(actual, expected);
}

}  // namespace
}  // namespace tandem::cuda
