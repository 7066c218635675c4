#include "kernels/cuda/embedding.h"

#include "kernels/cpu/embedding.h"
#include "kernels/cuda/testing.h"

namespace tandem::cuda {
namespace {

class EmbeddingTest : public CudaTest {};

TEST_F(EmbeddingTest, GatherIsExactAndBackwardAddsRepeatedIds) {
  constexpr int kVocab = 1000, kDim = 257, kRows = 3001;  // More rows than ids: ids repeat.
  const std::vector<float> table = RandomFloats(int64_t{kVocab} * kDim, 31);
  const std::vector<int> ids = RandomInts(kRows, 32, kVocab);
  const std::vector<float> dout = RandomFloats(int64_t{kRows} * kDim, 33);
  std::vector<float> out(int64_t{kRows} * kDim), dtable(table.size(), 0.0f);
  cpu::EmbeddingGather(table.data(), ids.data(), out.data(), kRows, kDim);
  cpu::EmbeddingBackward(dout.data(), ids.data(), dtable.data(), kRows, kDim);

  DeviceArray<float> table_d = Upload(table), dout_d = Upload(dout);
  DeviceArray<int> ids_d = Upload(ids);
  DeviceArray<float> out_d = DeviceZeros<float>(out.size());
  DeviceArray<float> dtable_d = DeviceZeros<float>(table.size());
  ASSERT_TRUE(EmbeddingGather(table_d.data(), ids_d.data(), out_d.data(), kRows, kDim).ok());
  ASSERT_TRUE(EmbeddingBackward(dout_d.data(), ids_d.data(), dtable_d.data(), kRows, kDim).ok());
  ExpectAllNear(Download(out_d), out, 0.0f);
  // About three rows share each id; atomics add them in any order.
  ExpectAllNear(Download(dtable_d), dtable, 1e-6f, 1e-6f);
}

TEST_F(EmbeddingTest, NoRowsIsANoOp) {
  EXPECT_TRUE(EmbeddingGather(nullptr, nullptr, nullptr, 0, 64).ok());
  EXPECT_TRUE(EmbeddingBackward(nullptr, nullptr, nullptr, 0, 64).ok());
}

}  // namespace
}  // namespace tandem::cuda
