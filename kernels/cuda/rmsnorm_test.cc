#include "kernels/cuda/rmsnorm.h"

#include "kernels/cpu/rmsnorm.h"
#include "kernels/cuda/testing.h"

namespace tandem::cuda {
namespace {

class RmsNormTest : public CudaTest, public ::testing::WithParamInterface<std::pair<int, int>> {};

// Rows x dim: a single odd row, a tall odd shape, DeepSeek-V3's width.
INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormTest,
                         ::testing::Values(std::pair{1, 7}, std::pair{131, 257},
                                           std::pair{300, 7168}));

TEST_P(RmsNormTest, ForwardAndBackwardMatchTheCpu) {
  const auto [rows, dim] = GetParam();
  const size_t n = static_cast<size_t>(rows) * dim;
  const std::vector<float> x = RandomFloats(n, 51, -2.0f, 2.0f), dy = RandomFloats(n, 52);
  const std::vector<float> weight = RandomFloats(dim, 53, 0.5f, 1.5f);
  std::vector<float> y(n), rstd(rows), dx = RandomFloats(n, 54), dweight = RandomFloats(dim, 55);
  DeviceArray<float> x_d = Upload(x), dy_d = Upload(dy), weight_d = Upload(weight);
  DeviceArray<float> y_d = DeviceZeros<float>(n), rstd_d = DeviceZeros<float>(rows);
  DeviceArray<float> dx_d = Upload(dx), dweight_d = Upload(dweight);

  cpu::RmsNorm(x.data(), weight.data(), y.data(), rstd.data(), rows, dim, 1e-6f);
  cpu::RmsNormBackward(x.data(), weight.data(), rstd.data(), dy.data(), dx.data(), dweight.data(),
                       rows, dim);
  ASSERT_TRUE(
      RmsNorm(x_d.data(), weight_d.data(), y_d.data(), rstd_d.data(), rows, dim, 1e-6f).ok());
  ASSERT_TRUE(RmsNormBackward(x_d.data(), weight_d.data(), rstd_d.data(), dy_d.data(), dx_d.data(),
                              dweight_d.data(), rows, dim)
                  .ok());
  // The CPU sums in double, the GPU in float trees: relative error grows like log2(dim) ulp.
  ExpectAllNear(Download(rstd_d), rstd, 0.0f, 1e-5f);
  ExpectAllNear(Download(y_d), y, 1e-6f, 1e-5f);
  ExpectAllNear(Download(dx_d), dx, 1e-5f, 1e-4f);
  ExpectAllNear(Download(dweight_d), dweight, 1e-4f, 1e-4f);  // Sums over up to 300 rows.
}

TEST_F(CudaTest, RmsNormWithoutRowsOrOptionalOutputsIsFine) {
  EXPECT_TRUE(RmsNorm(nullptr, nullptr, nullptr, nullptr, 0, 64, 1e-6f).ok());
  const std::vector<float> x = RandomFloats(64, 56), weight(64, 1.0f);
  DeviceArray<float> x_d = Upload(x), weight_d = Upload(weight), y_d = DeviceZeros<float>(64);
  DeviceArray<float> rstd_d = DeviceZeros<float>(1);
  ASSERT_TRUE(RmsNorm(x_d.data(), weight_d.data(), y_d.data(), nullptr, 1, 64, 1e-6f).ok());
  ASSERT_TRUE(RmsNorm(x_d.data(), weight_d.data(), y_d.data(), rstd_d.data(), 1, 64, 1e-6f).ok());
  // Backward with neither gradient wanted touches nothing.
  EXPECT_TRUE(RmsNormBackward(x_d.data(), weight_d.data(), rstd_d.data(), x_d.data(), nullptr,
                              nullptr, 1, 64)
                  .ok());
  EXPECT_TRUE(Synchronize().ok());
}

}  // namespace
}  // namespace tandem::cuda
