#include "kernels/cuda/adamw.h"

#include "kernels/cpu/adamw.h"
#include "kernels/cuda/testing.h"

namespace tandem::cuda {
namespace {

// Calls say cuda:: because the cpu::AdamWStep argument also finds cpu::AdamWUpdate.
class AdamWTest : public CudaTest {};

// Three updates with and without decay, state carried between them, against the CPU update.
TEST_F(AdamWTest, ThreeStepsMatchTheCpu) {
  constexpr int64_t kN = 70'001;
  for (const bool decay : {true, false}) {
    std::vector<float> value = RandomFloats(kN, 11), m(kN, 0.0f), v(kN, 0.0f);
    DeviceArray<float> value_d = Upload(value), m_d = Upload(m), v_d = Upload(v);
    for (int t = 1; t <= 3; ++t) {
      const std::vector<float> grad = RandomFloats(kN, 20 + t, -3.0f, 3.0f);
      const cpu::AdamWStep step = cpu::AdamWStep::For(1e-3f, t, 0.9f, 0.999f, 1e-8f, 0.01f);
      cpu::AdamWUpdate(value.data(), grad.data(), m.data(), v.data(), kN, decay, step);
      DeviceArray<float> grad_d = Upload(grad);
      ASSERT_TRUE(
          cuda::AdamWUpdate(value_d.data(), grad_d.data(), m_d.data(), v_d.data(), kN, decay, step)
              .ok());
    }
    // The GPU fuses multiply-adds; one rounding less per operation.
    ExpectAllNear(Download(value_d), value, 1e-6f, 1e-5f);
    ExpectAllNear(Download(m_d), m, 1e-6f, 1e-5f);
    ExpectAllNear(Download(v_d), v, 1e-6f, 1e-5f);
  }
}

TEST_F(AdamWTest, EmptyParameterIsANoOp) {
  EXPECT_TRUE(
      cuda::AdamWUpdate(nullptr, nullptr, nullptr, nullptr, 0, true, cpu::AdamWStep{}).ok());
}

}  // namespace
}  // namespace tandem::cuda
