#include "kernels/cuda/grouped_lora.h"

#include "kernels/cpu/grouped_lora.h"
#include "kernels/cuda/testing.h"

namespace tandem::cuda {
namespace {

// The expert layouts of kernels/cpu/grouped_lora.h, as (A shared, B shared).
struct Layout {
  const char* name;
  bool shared_a;
  bool shared_b;
};

class GroupedLoraTest : public CudaTest, public ::testing::WithParamInterface<Layout> {};

INSTANTIATE_TEST_SUITE_P(ExpertLayouts, GroupedLoraTest,
                         ::testing::Values(Layout{"per_expert", false, false},
                                           Layout{"shared", true, true},
                                           Layout{"shared_outer_gate_up", true, false},
                                           Layout{"shared_outer_down", false, true}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST_P(GroupedLoraTest, ForwardAndBackwardMatchTheCpu) {
  const Layout layout = GetParam();
  // Odd widths, rank 8, empty groups and groups across tile edges.
  constexpr int kIn = 257, kOut = 131, kRank = 8, kGroups = 6, kRows = 300;
  const std::vector<int> offsets = {0, 3, 3, 70, 199, 300, 300};
  const int64_t a_stride = layout.shared_a ? 0 : int64_t{kRank} * kIn;
  const int64_t b_stride = layout.shared_b ? 0 : int64_t{kOut} * kRank;
  const size_t a_size = (layout.shared_a ? 1 : kGroups) * size_t{kRank} * kIn;
  const size_t b_size = (layout.shared_b ? 1 : kGroups) * size_t{kOut} * kRank;
  const std::vector<float> x = RandomFloats(size_t{kRows} * kIn, 121);
  const std::vector<float> a = RandomFloats(a_size, 122), b = RandomFloats(b_size, 123);
  const std::vector<float> dy = RandomFloats(size_t{kRows} * kOut, 124);
  std::vector<float> h(size_t{kRows} * kRank), y = RandomFloats(size_t{kRows} * kOut, 125);
  std::vector<float> dx = RandomFloats(x.size(), 126), da = RandomFloats(a_size, 127);
  std::vector<float> db = RandomFloats(b_size, 128);
  DeviceArray<float> x_d = Upload(x), a_d = Upload(a), b_d = Upload(b), dy_d = Upload(dy);
  DeviceArray<float> h_d = DeviceZeros<float>(h.size()), y_d = Upload(y), dx_d = Upload(dx);
  DeviceArray<float> da_d = Upload(da), db_d = Upload(db);
  DeviceArray<float> dh_d = DeviceZeros<float>(size_t{kRows} * kRank);
  DeviceArray<int> offsets_d = Upload(offsets);

  const kernels::GroupedLoraWeights host_lora{a.data(), b.data(), a_stride, b_stride, kRank, 0.5f};
  cpu::GroupedLoraForward(x.data(), offsets.data(), kGroups, kIn, kOut, host_lora, h.data(),
                          y.data());
  cpu::GroupedLoraBackward(x.data(), offsets.data(), kGroups, kIn, kOut, host_lora, h.data(),
                           dy.data(), dx.data(), da.data(), db.data());
  const kernels::GroupedLoraWeights device_lora{a_d.data(), b_d.data(), a_stride,
                                                b_stride,   kRank,      0.5f};
  ASSERT_TRUE(cuda::GroupedLoraForward(x_d.data(), offsets_d.data(), kGroups, kRows, kIn, kOut,
                                       device_lora, h_d.data(), y_d.data())
                  .ok());
  ASSERT_TRUE(cuda::GroupedLoraBackward(x_d.data(), offsets_d.data(), kGroups, kRows, kIn, kOut,
                                        device_lora, h_d.data(), dy_d.data(), dx_d.data(),
                                        da_d.data(), db_d.data(), dh_d.data())
                  .ok());
  // Sums of up to 300 products in a different order from OpenBLAS.
  ExpectAllNear(Download(h_d), h, 1e-4f, 1e-4f);
  ExpectAllNear(Download(y_d), y, 1e-4f, 1e-4f);
  ExpectAllNear(Download(dx_d), dx, 1e-4f, 1e-4f);
  ExpectAllNear(Download(da_d), da, 1e-4f, 1e-4f);
  ExpectAllNear(Download(db_d), db, 1e-4f, 1e-4f);
}

}  // namespace
}  // namespace tandem::cuda
