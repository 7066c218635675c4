#include "kernels/cuda/axpy.h"

#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/device.h"

namespace tandem::cuda {
namespace {

class AxpyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (VisibleDeviceCount() == 0) GTEST_SKIP() << "no GPU visible; CUDA kernel not run";
  }
};

TEST_F(AxpyTest, MatchesHostLoopOnOddLength) {
  constexpr int64_t kN = 1'000'003;  // Not a multiple of the block size or the grid stride.
  std::vector<float> x(kN), y(kN), expected(kN);
  for (int64_t i = 0; i < kN; ++i) {
    x[i] = static_cast<float>(i % 97) * 0.5f;
    y[i] = static_cast<float>(i % 13) - 6.0f;
    expected[i] = 3.0f * x[i] + y[i];
  }
  ASSERT_EQ(Axpy(3.0f, x.data(), y.data(), kN), "");
  for (int64_t i = 0; i < kN; ++i) ASSERT_FLOAT_EQ(y[i], expected[i]) << "at " << i;
}

TEST_F(AxpyTest, EmptyInputIsANoOp) { EXPECT_EQ(Axpy(2.0f, nullptr, nullptr, 0), ""); }

}  // namespace
}  // namespace tandem::cuda
