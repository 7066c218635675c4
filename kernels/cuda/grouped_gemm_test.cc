#include "kernels/cuda/grouped_gemm.h"

#include "kernels/cuda/testing.h"

namespace tandem::cuda {
namespace {

// Small integers keep every fp32 product and sum exact, so the GPU must match to the bit
// (CUTLASS's grouped GEMM example checks the same way).
std::vector<float> SmallIntegers(size_t n, uint32_t seed) {
  std::vector<float> values;
  for (const int v : RandomInts(n, seed, 7)) values.push_back(static_cast<float>(v - 3));
  return values;
}

// Group sizes around the 64-row tile, with empty groups first, in the middle and last.
const std::vector<int> kOffsets = {0, 0, 1, 65, 65, 193, 256, 256};
constexpr int kGroups = 7, kRows = 256;

class GroupedGemmTest : public CudaTest {};

TEST_F(GroupedGemmTest, RowGroupsAreExactOnSmallIntegersForBothWeightLayouts) {
  constexpr int kK = 70, kN = 67;
  const std::vector<float> a = SmallIntegers(size_t{kRows} * kK, 111);
  const std::vector<float> w = SmallIntegers(size_t{kGroups} * kK * kN, 112);
  const std::vector<float> c_start = SmallIntegers(size_t{kRows} * kN, 113);
  DeviceArray<float> a_d = Upload(a), w_d = Upload(w);
  DeviceArray<int> offsets_d = Upload(kOffsets);
  for (const bool transpose_w : {true, false}) {
    std::vector<float> expected = c_start;
    for (int g = 0; g < kGroups; ++g) {
      const float* wg = w.data() + size_t{1} * g * kK * kN;
      for (int r = kOffsets[g]; r < kOffsets[g + 1]; ++r) {
        for (int c = 0; c < kN; ++c) {
          float sum = 0.0f;
          for (int kk = 0; kk < kK; ++kk) {
            sum += a[size_t{1} * r * kK + kk] * (transpose_w ? wg[c * kK + kk] : wg[kk * kN + c]);
          }
          expected[size_t{1} * r * kN + c] = 2.0f * sum + 3.0f * c_start[size_t{1} * r * kN + c];
        }
      }
    }
    DeviceArray<float> c_d = Upload(c_start);
    const RowGroupedGemm gemm{.a = a_d.data(),
                              .lda = kK,
                              .w = w_d.data(),
                              .w_group_stride = kK * kN,
                              .ldw = transpose_w ? kK : kN,
                              .transpose_w = transpose_w,
                              .c = c_d.data(),
                              .ldc = kN,
                              .n = kN,
                              .k = kK,
                              .alpha = 2.0f,
                              .beta = 3.0f};
    ASSERT_TRUE(GroupedGemm(gemm, offsets_d.data(), kGroups, kRows).ok());
    EXPECT_EQ(Download(c_d), expected) << "transpose_w=" << transpose_w;
  }
}

TEST_F(GroupedGemmTest, WeightGradientsAreExactOnSmallIntegersPerGroupAndShared) {
  constexpr int kM = 65, kN = 9;
  const std::vector<float> a = SmallIntegers(size_t{kRows} * kM, 114);
  const std::vector<float> b = SmallIntegers(size_t{kRows} * kN, 115);
  DeviceArray<float> a_d = Upload(a), b_d = Upload(b);
  DeviceArray<int> offsets_d = Upload(kOffsets);
  for (const bool shared : {false, true}) {
    const int outputs = shared ? 1 : kGroups;
    const std::vector<float> c_start = SmallIntegers(static_cast<size_t>(outputs) * kM * kN, 116);
    std::vector<float> expected = c_start;
    for (int g = 0; g < kGroups; ++g) {
      float* c = expected.data() + (shared ? 0 : size_t{1} * g * kM * kN);
      for (int r = kOffsets[g]; r < kOffsets[g + 1]; ++r) {
        for (int i = 0; i < kM; ++i) {
          for (int j = 0; j < kN; ++j) {
            c[i * kN + j] += 0.5f * a[size_t{1} * r * kM + i] * b[size_t{1} * r * kN + j];
          }
        }
      }
    }
    DeviceArray<float> c_d = Upload(c_start);
    const ReductionGroupedGemm gemm{.a = a_d.data(),
                                    .lda = kM,
                                    .b = b_d.data(),
                                    .ldb = kN,
                                    .c = c_d.data(),
                                    .c_group_stride = shared ? 0 : kM * kN,
                                    .ldc = kN,
                                    .m = kM,
                                    .n = kN,
                                    .alpha = 0.5f};
    ASSERT_TRUE(GroupedGemm(gemm, offsets_d.data(), kGroups).ok());
    EXPECT_EQ(Download(c_d), expected) << "shared=" << shared;
  }
}

TEST_F(GroupedGemmTest, NothingToComputeIsANoOpAndAnOversizedLaunchIsRefused) {
  const RowGroupedGemm empty{.a = nullptr,
                             .lda = 1,
                             .w = nullptr,
                             .w_group_stride = 0,
                             .ldw = 1,
                             .transpose_w = true,
                             .c = nullptr,
                             .ldc = 1,
                             .n = 1,
                             .k = 1};
  EXPECT_TRUE(GroupedGemm(empty, nullptr, 4, 0).ok());
  EXPECT_EQ(GroupedGemm(empty, nullptr, 4, 1 << 30).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::cuda
