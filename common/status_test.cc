#include "common/status.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::SizeIs;

TEST(StatusTest, EveryCanonicalCodeMapsToTheSameGrpcCode) {
  for (int code = 1; code <= 16; ++code) {
    const absl::Status status(static_cast<absl::StatusCode>(code), "why");
    const grpc::Status grpc_status = ToGrpcStatus(status);
    EXPECT_EQ(static_cast<int>(grpc_status.error_code()), code);
    EXPECT_EQ(grpc_status.error_message(), "why");
    EXPECT_EQ(FromGrpcStatus(grpc_status), status);
  }
}

TEST(StatusTest, OkMapsToOk) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

TEST(StatusTest, LongMessagesAreTruncatedAndSaySo) {
  const std::string long_message(10000, 'x');
  const grpc::Status status = ToGrpcStatus(absl::InvalidArgumentError(long_message));
  EXPECT_LE(status.error_message().size(), kMaxStatusMessageBytes);
  EXPECT_THAT(status.error_message(), HasSubstr("bytes truncated]"));
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::INTERNAL, long_message)).message().size(),
            status.error_message().size());
}

TEST(StatusTest, TruncationNeverSplitsAUtf8Character) {
  std::string message;
  for (int i = 0; i < 100; ++i) message += "é";  // Two bytes each.
  for (size_t limit = 30; limit < 60; ++limit) {
    const std::string cut = TruncateStatusMessage(message, limit);
    EXPECT_LE(cut.size(), limit);
    const std::string kept = cut.substr(0, cut.find(" ..."));
    EXPECT_EQ(kept.size() % 2, 0u) << "limit " << limit << ": " << cut;
    EXPECT_THAT(cut, EndsWith(" bytes truncated]"));
  }
}

TEST(StatusTest, ShortMessagesAreKeptWhole) {
  EXPECT_EQ(TruncateStatusMessage("fine", 4), "fine");
  EXPECT_THAT(TruncateStatusMessage("", 0), SizeIs(0));
}

}  // namespace
}  // namespace tandem
