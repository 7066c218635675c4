#include "kernels/cuda/grouped_gemm.h"

#include <cmath>

#include "common/dtype.h"
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

// The fp32 kernel and the tensor-core one share their contract (and, on values bf16 holds
// exactly, their results).
using RowGemmFn = absl::Status (*)(const RowGroupedGemm&, const int*, int, int, Stream);
const RowGemmFn kFp32 = &GroupedGemm;
const RowGemmFn kBf16 = &GroupedGemmBf16;

// C_g = 2 · A_g · op(W_g) + 3 · C_g over `offsets`, on the GPU and by a host loop: exact.
void ExpectRowGroupsExact(const std::vector<int>& offsets, int k, int n,
                          RowGemmFn gemm_fn = kFp32) {
  const int groups = static_cast<int>(offsets.size()) - 1, rows = offsets.back();
  const std::vector<float> a = SmallIntegers(size_t{1} * rows * k, 111);
  const std::vector<float> w = SmallIntegers(size_t{1} * groups * k * n, 112);
  const std::vector<float> c_start = SmallIntegers(size_t{1} * rows * n, 113);
  DeviceArray<float> a_d = Upload(a), w_d = Upload(w);
  DeviceArray<int> offsets_d = Upload(offsets);
  for (const bool transpose_w : {true, false}) {
    std::vector<float> expected = c_start;
    for (int g = 0; g < groups; ++g) {
      const float* wg = w.data() + size_t{1} * g * k * n;
      for (int r = offsets[g]; r < offsets[g + 1]; ++r) {
        for (int c = 0; c < n; ++c) {
          float sum = 0.0f;
          for (int kk = 0; kk < k; ++kk) {
            sum += a[size_t{1} * r * k + kk] * (transpose_w ? wg[c * k + kk] : wg[kk * n + c]);
          }
          expected[size_t{1} * r * n + c] = 2.0f * sum + 3.0f * c_start[size_t{1} * r * n + c];
        }
      }
    }
    DeviceArray<float> c_d = Upload(c_start);
    const RowGroupedGemm gemm{.a = a_d.data(),
                              .lda = k,
                              .w = w_d.data(),
                              .w_group_stride = int64_t{k} * n,
                              .ldw = transpose_w ? k : n,
                              .transpose_w = transpose_w,
                              .c = c_d.data(),
                              .ldc = n,
                              .n = n,
                              .k = k,
                              .alpha = 2.0f,
                              .beta = 3.0f};
    ASSERT_TRUE(gemm_fn(gemm, offsets_d.data(), groups, rows, nullptr).ok());
    EXPECT_EQ(Download(c_d), expected) << "transpose_w=" << transpose_w;
  }
}

TEST_F(GroupedGemmTest, RowGroupsAreExactOnSmallIntegersForBothWeightLayouts) {
  ExpectRowGroupsExact(kOffsets, 70, 67);  // Small tiles: narrow output, short groups.
}

// Wide outputs over groups of hundreds of rows take the 128x128 tiles; group edges inside and
// across them, odd widths and depths.
TEST_F(GroupedGemmTest, LargeTilesAreExactToo) {
  ExpectRowGroupsExact({0, 130, 130, 400, 527}, 37, 261);
}

// Decode's shape, a few rows per group against long rows of W, takes GroupedGemmFewRows for
// W as [n, k] (tiles for [k, n]): a group longer than one pass (40 rows), empty groups, odd
// depths (element loads) and depths of whole quads (vector loads).
TEST_F(GroupedGemmTest, FewRowsPerGroupAreExact) {
  const std::vector<int> few = {0, 0, 3, 3, 43, 44, 50, 50, 51};
  ExpectRowGroupsExact(few, 130, 67);
  ExpectRowGroupsExact(few, 256, 67);
}

TEST_F(GroupedGemmTest, FewRowsNeedWAsRowsOfK) {
  const RowGroupedGemm gemm{.transpose_w = false, .n = 4, .k = 256};
  EXPECT_EQ(GroupedGemmFewRows(gemm, nullptr, 1).code(), absl::StatusCode::kInvalidArgument);
}

// Small integers are bf16 values, so the tensor cores must match to the bit as well: short and
// empty groups, odd depths (element loads) and depths of whole quads (vector loads).
TEST_F(GroupedGemmTest, Bf16RowGroupsAreExactOnSmallIntegers) {
  ExpectRowGroupsExact(kOffsets, 70, 67, kBf16);
  ExpectRowGroupsExact({0, 130, 130, 400, 527}, 37, 261, kBf16);
  ExpectRowGroupsExact({0, 130, 130, 400, 527}, 96, 260, kBf16);
}

// On arbitrary floats the tensor-core product is the product of the bf16-rounded inputs, up to
// fp32 summation order, and measurably not the product of the unrounded ones.
TEST_F(GroupedGemmTest, Bf16RowGroupsMultiplyTheRoundedInputs) {
  const std::vector<int> offsets = {0, 100, 100, 300};
  constexpr int kK = 200, kN = 136, kGroupCount = 3, kRowCount = 300;
  const std::vector<float> a = RandomFloats(size_t{kRowCount} * kK, 121);
  const std::vector<float> w = RandomFloats(size_t{kGroupCount} * kN * kK, 122);
  const auto rounded = [](float v) { return ToFloat(ToBFloat16(v)); };
  DeviceArray<float> a_d = Upload(a), w_d = Upload(w), c_d = DeviceZeros<float>(kRowCount * kN);
  DeviceArray<int> offsets_d = Upload(offsets);
  const RowGroupedGemm gemm{.a = a_d.data(),
                            .lda = kK,
                            .w = w_d.data(),
                            .w_group_stride = int64_t{kN} * kK,
                            .ldw = kK,
                            .transpose_w = true,
                            .c = c_d.data(),
                            .ldc = kN,
                            .n = kN,
                            .k = kK};
  ASSERT_TRUE(GroupedGemmBf16(gemm, offsets_d.data(), kGroupCount, kRowCount).ok());
  const std::vector<float> c = Download(c_d);
  double largest_rounding_effect = 0.0;
  for (int g = 0; g < kGroupCount; ++g) {
    for (int r = offsets[g]; r < offsets[g + 1]; ++r) {
      for (int col = 0; col < kN; ++col) {
        double of_rounded = 0.0, of_exact = 0.0;
        for (int kk = 0; kk < kK; ++kk) {
          const float x = a[size_t{1} * r * kK + kk];
          const float y = w[(size_t{1} * g * kN + col) * kK + kk];
          of_rounded += double{rounded(x)} * rounded(y);
          of_exact += double{x} * y;
        }
        ASSERT_NEAR(c[size_t{1} * r * kN + col], of_rounded, 2e-4) << "row " << r << " col " << col;
        largest_rounding_effect =
            std::max(largest_rounding_effect, std::abs(of_rounded - of_exact));
      }
    }
  }
  EXPECT_GT(largest_rounding_effect, 1e-3);
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
  for (const RowGemmFn gemm_fn : {kFp32, kBf16}) {
    EXPECT_TRUE(gemm_fn(empty, nullptr, 4, 0, nullptr).ok());
    EXPECT_EQ(gemm_fn(empty, nullptr, 4, 1 << 30, nullptr).code(),
              absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace tandem::cuda
