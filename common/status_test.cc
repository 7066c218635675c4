#include "common/status.h"

#include <string>

#include "gmock/gmock.h"
#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"
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

// An invalid field goes on the wire as the google.rpc.Status a client of any language decodes
// (BadRequest and ErrorInfo in its details) and comes back from it whole.
TEST(StatusTest, AnInvalidFieldTravelsAsBadRequestAndErrorInfoDetails) {
  const absl::Status invalid = InvalidField("spec.group_size", "spec.group_size: GRPO needs >= 2");
  const grpc::Status wire = ToGrpcStatus(invalid);
  EXPECT_EQ(wire.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(wire.error_message(), "spec.group_size: GRPO needs >= 2");
  google::rpc::Status details;
  ASSERT_TRUE(details.ParseFromString(wire.error_details()));
  EXPECT_EQ(details.code(), 3);
  ASSERT_EQ(details.details_size(), 2);
  google::rpc::BadRequest bad_request;
  google::rpc::ErrorInfo info;
  for (const google::protobuf::Any& any : details.details()) {
    if (any.Is<google::rpc::BadRequest>()) ASSERT_TRUE(any.UnpackTo(&bad_request));
    if (any.Is<google::rpc::ErrorInfo>()) ASSERT_TRUE(any.UnpackTo(&info));
  }
  ASSERT_EQ(bad_request.field_violations_size(), 1);
  EXPECT_EQ(bad_request.field_violations(0).field(), "spec.group_size");
  EXPECT_EQ(info.reason(), "INVALID_FIELD");
  EXPECT_EQ(info.domain(), "tandem");
  EXPECT_EQ(info.metadata().at("field"), "spec.group_size");

  const absl::Status back = FromGrpcStatus(wire);
  EXPECT_EQ(back.code(), absl::StatusCode::kInvalidArgument);
  ASSERT_THAT(FieldViolations(back), SizeIs(1));
  EXPECT_EQ(FieldViolations(back)[0].field, "spec.group_size");
  EXPECT_EQ(FieldViolations(back)[0].description, "spec.group_size: GRPO needs >= 2");
  EXPECT_EQ(ErrorReason(back), "INVALID_FIELD");
}

TEST(StatusTest, AStatusWithoutDetailsSendsNone) {
  EXPECT_TRUE(ToGrpcStatus(absl::NotFoundError("no job")).error_details().empty());
  EXPECT_THAT(FieldViolations(absl::InvalidArgumentError("why")), SizeIs(0));
  EXPECT_EQ(ErrorReason(absl::InvalidArgumentError("why")), "");
  // Details that are not a google.rpc.Status are ignored, not trusted.
  const absl::Status garbled =
      FromGrpcStatus(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "why", "\xff\xff"));
  EXPECT_THAT(FieldViolations(garbled), SizeIs(0));
}

TEST(StatusTest, ALongViolationIsCutToFitTheTrailers) {
  const std::string field(5000, 'f'), message(5000, 'm');
  const grpc::Status wire = ToGrpcStatus(InvalidField(field, message));
  google::rpc::Status details;
  ASSERT_TRUE(details.ParseFromString(wire.error_details()));
  EXPECT_EQ(details.message(), wire.error_message()) << "the two copies read the same";
  const size_t base64_details = (wire.error_details().size() + 2) / 3 * 4;
  EXPECT_LE(wire.error_message().size() + base64_details, size_t{8} << 10);
}

}  // namespace
}  // namespace tandem
