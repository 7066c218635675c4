#include "kernels/cuda/swiglu.h"

#include "kernels/cpu/swiglu.h"
#include "kernels/cuda/testing.h"

namespace tandem::cuda {
namespace {

class SwiGluTest : public CudaTest {};

TEST_F(SwiGluTest, ForwardAndBackwardMatchTheCpuOnAnOddLength) {
  constexpr int64_t kN = 100'003;
  // Wide gates reach the saturated ends of the sigmoid, including exp overflow.
  const std::vector<float> gate = RandomFloats(kN, 1, -100.0f, 100.0f);
  const std::vector<float> up = RandomFloats(kN, 2);
  const std::vector<float> dout = RandomFloats(kN, 3);
  std::vector<float> out(kN), dgate = RandomFloats(kN, 4), dup = RandomFloats(kN, 5);
  const std::vector<float> dgate_start = dgate, dup_start = dup;
  cpu::SwiGlu(gate.data(), up.data(), out.data(), kN);
  cpu::SwiGluBackward(gate.data(), up.data(), dout.data(), dgate.data(), dup.data(), kN);

  DeviceArray<float> gate_d = Upload(gate), up_d = Upload(up), dout_d = Upload(dout);
  DeviceArray<float> out_d = DeviceZeros<float>(kN);
  DeviceArray<float> dgate_d = Upload(dgate_start), dup_d = Upload(dup_start);
  ASSERT_TRUE(SwiGlu(gate_d.data(), up_d.data(), out_d.data(), kN).ok());
  ASSERT_TRUE(
      SwiGluBackward(gate_d.data(), up_d.data(), dout_d.data(), dgate_d.data(), dup_d.data(), kN)
          .ok());
  // expf on the GPU is within 2 ulp of the host's; products add a few more.
  ExpectAllNear(Download(out_d), out, 1e-6f, 1e-5f);
  ExpectAllNear(Download(dgate_d), dgate, 1e-6f, 1e-5f);
  ExpectAllNear(Download(dup_d), dup, 1e-6f, 1e-5f);
}

TEST_F(SwiGluTest, NullGradientOutputsAreSkipped) {
  const std::vector<float> gate = RandomFloats(257, 6), up = RandomFloats(257, 7);
  DeviceArray<float> gate_d = Upload(gate), up_d = Upload(up), dout_d = Upload(gate);
  DeviceArray<float> dup_d = DeviceZeros<float>(257);
  ASSERT_TRUE(
      SwiGluBackward(gate_d.data(), up_d.data(), dout_d.data(), nullptr, dup_d.data(), 257).ok());
  std::vector<float> expected(257, 0.0f);
  cpu::SwiGluBackward(gate.data(), up.data(), gate.data(), nullptr, expected.data(), 257);
  ExpectAllNear(Download(dup_d), expected, 1e-6f, 1e-5f);
}

TEST_F(SwiGluTest, EmptyInputLaunchesNothing) {
  EXPECT_TRUE(SwiGlu(nullptr, nullptr, nullptr, 0).ok());
  EXPECT_TRUE(SwiGluBackward(nullptr, nullptr, nullptr, nullptr, nullptr, 0).ok());
}

}  // namespace
}  // namespace tandem::cuda
