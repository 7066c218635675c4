#include "common/string_limits.h"

#include <string>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(StringLimitsTest, AStringAtItsLimitPassesAndOneByteMoreIsRefusedNamingTheSizes) {
  EXPECT_TRUE(
      CheckMaxBytes("spec.output_dir", std::string(kMaxPathBytes, 'p'), kMaxPathBytes).ok());
  const absl::Status status =
      CheckMaxBytes("spec.output_dir", std::string(kMaxPathBytes + 1, 'p'), kMaxPathBytes);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "spec.output_dir has 4097 bytes; at most 4096");
}

}  // namespace
}  // namespace tandem
