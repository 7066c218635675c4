#include "kernels/cuda/elementwise.h"

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

}  // namespace
}  // namespace tandem::cuda
