#include "common/nccl_communicator.h"

#include "kernels/cuda/testing.h"

namespace tandem {
namespace {

// Argument checks come before any GPU work, so these run everywhere.
TEST(NcclCommunicatorTest, RejectsABadIdOrRankWithoutTouchingTheGpu) {
  EXPECT_EQ(NcclCommunicator::Create("short", 0, 1, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::string id(128, '\0');
  EXPECT_EQ(NcclCommunicator::Create(id, 1, 1, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclCommunicator::Create(id, 0, 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Runs everywhere: a unique id needs a GPU, and without one both calls say so.
TEST(NcclCommunicatorTest, TheBootstrapNeedsAGpu) {
  absl::StatusOr<std::string> id = NcclCommunicator::NewNcclUniqueId();
  if (cuda::VisibleDeviceCount() > 0) {
    ASSERT_TRUE(id.ok()) << id.status();
    EXPECT_EQ(id->size(), 128u);
    return;
  }
  EXPECT_EQ(id.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(NcclCommunicator::Create(std::string(128, '\0'), 0, 1, 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

class OneRankTest : public cuda::CudaTest {};

// The bootstrap path a trainer takes (id from rank 0, Create on every rank), with one rank: the
// sum over one rank and the broadcast from it leave the data as it was.
TEST_F(OneRankTest, AllReduceAndBroadcastOverOneRankKeepTheData) {
  absl::StatusOr<std::string> id = NcclCommunicator::NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> communicator =
      NcclCommunicator::Create(*id, 0, 1, 0);
  ASSERT_TRUE(communicator.ok()) << communicator.status();
  EXPECT_EQ((*communicator)->rank(), 0);
  EXPECT_EQ((*communicator)->size(), 1);

  const std::vector<float> values = cuda::RandomFloats(100'003, 131);
  cuda::DeviceArray<float> data = cuda::Upload(values);
  ASSERT_TRUE((*communicator)->AllReduceSum(data.data(), values.size()).ok());
  EXPECT_EQ(cuda::Download(data), values);
  ASSERT_TRUE((*communicator)->Broadcast(data.data(), values.size(), 0).ok());
  EXPECT_EQ(cuda::Download(data), values);
  EXPECT_EQ((*communicator)->Broadcast(data.data(), values.size(), 1).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*communicator)->Barrier().ok());
  // All-to-all-v with one rank: what it sends itself arrives.
  cuda::DeviceArray<float> received = cuda::Upload(std::vector<float>(values.size(), 0.0f));
  const std::vector<int64_t> counts = {static_cast<int64_t>(values.size())};
  ASSERT_TRUE((*communicator)->AllToAllV(data.data(), counts, received.data(), counts).ok());
  EXPECT_EQ(cuda::Download(received), values);
  const std::vector<int64_t> two_ranks = {1, 1};
  EXPECT_EQ((*communicator)->AllToAllV(data.data(), two_ranks, received.data(), counts).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
