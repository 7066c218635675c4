#include "kernels/cuda/rope.h"

#include "kernels/cpu/rope.h"
#include "kernels/cuda/testing.h"

namespace tandem::cuda {
namespace {

class RopeTest : public CudaTest {
 protected:
  // Rotates a random [tokens, heads, head_dim] tensor forward and backward on both devices.
  void ExpectMatch(const cpu::RopeFrequencies& rope, int tokens, int heads, int max_position) {
    const int head_dim = 2 * static_cast<int>(rope.inv_freq.size());
    const size_t n = static_cast<size_t>(tokens) * heads * head_dim;
    const std::vector<int> positions = RandomInts(tokens, 61, max_position);
    std::vector<float> x = RandomFloats(n, 62), dx = RandomFloats(n, 63);
    DeviceArray<float> x_d = Upload(x), dx_d = Upload(dx);
    DeviceArray<int> positions_d = Upload(positions);
    absl::StatusOr<DeviceRopeFrequencies> rope_d = DeviceRopeFrequencies::Upload(rope);
    ASSERT_TRUE(rope_d.ok()) << rope_d.status();

    cpu::Rope(x.data(), positions.data(), tokens, heads, rope);
    cpu::RopeBackward(dx.data(), positions.data(), tokens, heads, rope);
    ASSERT_TRUE(Rope(x_d.data(), positions_d.data(), tokens, heads, *rope_d).ok());
    ASSERT_TRUE(RopeBackward(dx_d.data(), positions_d.data(), tokens, heads, *rope_d).ok());
    // Both take the angle's sine and cosine in double; only the float products may round apart.
    ExpectAllNear(Download(x_d), x, 1e-6f, 1e-6f);
    ExpectAllNear(Download(dx_d), dx, 1e-6f, 1e-6f);
  }
};

TEST_F(RopeTest, PlainFrequenciesMatchTheCpu) {
  ExpectMatch(cpu::RopeFrequencies::Plain(10000.0, 64), 97, 5, 4096);
}

TEST_F(RopeTest, YarnAtLongPositionsMatchesTheCpu) {
  cpu::YarnParams yarn;
  yarn.factor = 40.0;
  yarn.original_max_position = 4096;
  yarn.mscale = 1.0;
  yarn.mscale_all_dim = 1.0;
  ExpectMatch(cpu::RopeFrequencies::Yarn(10000.0, 128, yarn), 33, 3, 163840);
}

TEST_F(RopeTest, NoTokensIsANoOp) {
  absl::StatusOr<DeviceRopeFrequencies> rope =
      DeviceRopeFrequencies::Upload(cpu::RopeFrequencies::Plain(10000.0, 8));
  ASSERT_TRUE(rope.ok());
  EXPECT_TRUE(Rope(nullptr, nullptr, 0, 4, *rope).ok());
}

}  // namespace
}  // namespace tandem::cuda
