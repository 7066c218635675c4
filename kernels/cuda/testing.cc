#include "kernels/cuda/testing.h"

#include <cmath>

namespace tandem::cuda {

std::vector<float> RandomFloats(size_t n, uint32_t seed, float low, float high) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> distribution(low, high);
  std::vector<float> values(n);
  for (float& value : values) value = distribution(generator);
  return values;
}

std::vector<int> RandomInts(size_t n, uint32_t seed, int bound) {
  std::mt19937 generator(seed);
  std::uniform_int_distribution<int> distribution(0, bound - 1);
  std::vector<int> values(n);
  for (int& value : values) value = distribution(generator);
  return values;
}

void ExpectAllNear(const std::vector<float>& actual, const std::vector<float>& expected,
                   float abs_tolerance, float rel_tolerance) {
  ASSERT_EQ(actual.size(), expected.size());
  int reported = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const float bound = abs_tolerance + rel_tolerance * std::fabs(expected[i]);
    const bool near = std::fabs(actual[i] - expected[i]) <= bound ||
                      (std::isinf(expected[i]) && actual[i] == expected[i]);
    if (!near && reported++ < 5) {
      ADD_FAILURE() << "at " << i << ": " << actual[i] << " vs expected " << expected[i]
                    << " (tolerance " << bound << ")";
    }
  }
  EXPECT_EQ(reported, 0) << reported << " of " << actual.size() << " values differ";
}

}  // namespace tandem::cuda
