#include "kernels/cuda/permute.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "kernels/cpu/permute.h"
#include "kernels/cuda/testing.h"

namespace tandem::cuda {
namespace {

// Valid routes: k distinct experts per token, drawn with a skew so some experts get none.
std::vector<int16_t> RandomRoutes(int T, int k, int E, uint32_t seed) {
  std::mt19937 generator(seed);
  std::vector<int> experts(E);
  std::iota(experts.begin(), experts.end(), 0);
  std::vector<int16_t> ids;
  for (int t = 0; t < T; ++t) {
    std::shuffle(experts.begin(), experts.begin() + std::max(k, E / 2), generator);
    for (int j = 0; j < k; ++j) ids.push_back(static_cast<int16_t>(experts[j]));
  }
  return ids;
}

class PermuteTest : public CudaTest,
                    public ::testing::WithParamInterface<std::tuple<int, int, int, int>> {};

// Tokens, k, experts, width: demo-sized, odd, DeepSeek-V3's 256 experts with k = 8.
INSTANTIATE_TEST_SUITE_P(Shapes, PermuteTest,
                         ::testing::Values(std::tuple{1, 1, 1, 3}, std::tuple{77, 2, 8, 33},
                                           std::tuple{1000, 8, 256, 257}));

TEST_P(PermuteTest, MatchesTheCpuPermutationAndItsGradients) {
  const auto [T, k, E, d] = GetParam();
  const std::vector<int16_t> ids = RandomRoutes(T, k, E, 91);
  const cpu::ExpertPermutation expected = cpu::BuildPermutation(ids.data(), T, k, E);
  DeviceArray<int16_t> ids_d = Upload(ids);
  absl::StatusOr<DevicePermutation> permutation = DevicePermutation::Allocate(T + 5, k, E);
  ASSERT_TRUE(permutation.ok()) << permutation.status();
  ASSERT_TRUE(BuildPermutation(ids_d.data(), T, k, E, *permutation).ok());
  EXPECT_EQ(Download(permutation->offsets), expected.offsets);
  // The arrays hold `capacity` tokens; the first T * k slots are this permutation's.
  const size_t slots = static_cast<size_t>(T) * k;
  std::vector<int> source = Download(permutation->source);
  source.resize(slots);
  EXPECT_EQ(source, expected.source);

  const std::vector<float> x = RandomFloats(static_cast<size_t>(T) * d, 92);
  const std::vector<float> y = RandomFloats(slots * d, 93), gates = RandomFloats(slots, 94);
  const std::vector<float> dout = RandomFloats(static_cast<size_t>(T) * d, 95);
  std::vector<float> permuted(slots * d), dx = RandomFloats(x.size(), 96);
  std::vector<float> out = RandomFloats(x.size(), 97), dy = RandomFloats(y.size(), 98);
  std::vector<float> dgates = RandomFloats(slots, 99);
  DeviceArray<float> x_d = Upload(x), y_d = Upload(y), gates_d = Upload(gates);
  DeviceArray<float> dout_d = Upload(dout), permuted_d = DeviceZeros<float>(permuted.size());
  DeviceArray<float> dx_d = Upload(dx), out_d = Upload(out), dy_d = Upload(dy);
  DeviceArray<float> dgates_d = Upload(dgates);

  cpu::PermuteRows(x.data(), expected, permuted.data(), d);
  cpu::PermuteRowsBackward(y.data(), expected, dx.data(), d);
  cpu::UnpermuteAdd(y.data(), expected, gates.data(), out.data(), d);
  cpu::UnpermuteAddBackward(y.data(), expected, gates.data(), dout.data(), dy.data(), dgates.data(),
                            d);
  ASSERT_TRUE(PermuteRows(x_d.data(), *permutation, permuted_d.data(), d).ok());
  ASSERT_TRUE(PermuteRowsBackward(y_d.data(), *permutation, dx_d.data(), d).ok());
  ASSERT_TRUE(UnpermuteAdd(y_d.data(), *permutation, gates_d.data(), out_d.data(), d).ok());
  ASSERT_TRUE(UnpermuteAddBackward(y_d.data(), *permutation, gates_d.data(), dout_d.data(),
                                   dy_d.data(), dgates_d.data(), d)
                  .ok());
  ExpectAllNear(Download(permuted_d), permuted, 0.0f);  // A copy: exact.
  // Token sums of k rows, added in slot order here and in expert order on the CPU.
  ExpectAllNear(Download(dx_d), dx, 1e-6f, 1e-6f);
  ExpectAllNear(Download(out_d), out, 1e-6f, 1e-6f);
  ExpectAllNear(Download(dy_d), dy, 1e-6f, 1e-6f);
  ExpectAllNear(Download(dgates_d), dgates, 1e-5f, 1e-5f);  // Dots of d terms.
}

TEST_F(CudaTest, AnOutOfRangeIdGetsNoRowAndNothingIsWrittenOutOfBounds) {
  const std::vector<int16_t> ids = {0, 1, 7, 1};  // Token 1 slot 0 names expert 7 of 4.
  DeviceArray<int16_t> ids_d = Upload(ids);
  absl::StatusOr<DevicePermutation> permutation = DevicePermutation::Allocate(2, 2, 4);
  ASSERT_TRUE(permutation.ok());
  ASSERT_TRUE(BuildPermutation(ids_d.data(), 2, 2, 4, *permutation).ok());
  EXPECT_EQ(Download(permutation->offsets), (std::vector<int>{0, 1, 3, 3, 3}));
  EXPECT_EQ(Download(permutation->position), (std::vector<int>{0, 1, -1, 2}));
}

TEST_F(CudaTest, BuildPermutationRefusesMoreTokensThanAllocated) {
  absl::StatusOr<DevicePermutation> permutation = DevicePermutation::Allocate(4, 2, 8);
  ASSERT_TRUE(permutation.ok());
  EXPECT_EQ(BuildPermutation(nullptr, 5, 2, 8, *permutation).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildPermutation(nullptr, 4, 3, 8, *permutation).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::cuda
