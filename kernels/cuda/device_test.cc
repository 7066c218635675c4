#include "kernels/cuda/device.h"

#include "absl/strings/match.h"
#include "kernels/cuda/testing.h"

namespace tandem::cuda {
namespace {

TEST(ParseCudaDeviceTest, AcceptsCudaAndCudaColonOrdinal) {
  EXPECT_EQ(*ParseCudaDevice("cuda"), 0);
  EXPECT_EQ(*ParseCudaDevice("cuda:3"), 3);
  for (const char* bad : {"cpu", "cuda:", "cuda:-1", "cuda:x", "gpu:0", "cuda:1:2"}) {
    EXPECT_EQ(ParseCudaDevice(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

// Runs everywhere: without a GPU selection fails cleanly, with one an absent ordinal does.
TEST(SelectDeviceTest, ExplainsAMissingDevice) {
  const int count = VisibleDeviceCount();
  const absl::StatusOr<DeviceInfo> device = SelectDevice(count);
  ASSERT_EQ(device.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(
      absl::StrContains(device.status().message(), count == 0 ? "no CUDA device" : "requested but"))
      << device.status();
}

class DeviceMemoryTest : public CudaTest {};

TEST_F(DeviceMemoryTest, OutOfMemoryNamesTheSizeAsked) {
  constexpr size_t kPetabyte = size_t{1} << 50;
  const absl::StatusOr<DeviceMemory> memory = DeviceMemory::Allocate(kPetabyte);
  ASSERT_EQ(memory.status().code(), absl::StatusCode::kResourceExhausted) << memory.status();
  EXPECT_TRUE(absl::StrContains(memory.status().message(), "1125899906842624 bytes"));
  // The failure leaves the runtime usable.
  EXPECT_TRUE(DeviceMemory::Allocate(1 << 20).ok());
}

TEST_F(DeviceMemoryTest, RoundTripsThroughTheDevice) {
  const std::vector<float> values = RandomFloats(12345, 41);
  EXPECT_EQ(Download(Upload(values)), values);
  EXPECT_EQ(Download(DeviceZeros<float>(7)), std::vector<float>(7, 0.0f));
}

}  // namespace
}  // namespace tandem::cuda
