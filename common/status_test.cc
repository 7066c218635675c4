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

// A request that is invalid as a whole carries its reason, and no field.
TEST(StatusTest, AnInvalidRequestCarriesItsReasonAndNoField) {
  const absl::Status invalid = InvalidRequest("RESPONSE_TOO_LARGE", "at most 2^20 counts");
  EXPECT_EQ(invalid.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(invalid.message(), "at most 2^20 counts");
  const absl::Status back = FromGrpcStatus(ToGrpcStatus(invalid));
  EXPECT_EQ(ErrorReason(back), "RESPONSE_TOO_LARGE");
  EXPECT_THAT(FieldViolations(back), SizeIs(0));
  google::rpc::Status details;
  ASSERT_TRUE(details.ParseFromString(ToGrpcStatus(invalid).error_details()));
  google::rpc::ErrorInfo info;
  ASSERT_EQ(details.details_size(), 1);
  ASSERT_TRUE(details.details(0).UnpackTo(&info));
  EXPECT_EQ(info.domain(), "tandem");
}

// Context added to a detailed status keeps its code and details.
TEST(StatusTest, AnnotatingKeepsTheCodeAndTheDetails) {
  const absl::Status annotated =
      Annotate(InvalidField("records.records[2].key.job_id", "bad job_id: ''"), "record x: ");
  EXPECT_EQ(annotated.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(annotated.message(), "record x: bad job_id: ''");
  ASSERT_THAT(FieldViolations(annotated), SizeIs(1));
  EXPECT_EQ(FieldViolations(annotated)[0].field, "records.records[2].key.job_id");
  EXPECT_EQ(ErrorReason(annotated), "INVALID_FIELD");
  EXPECT_EQ(
      ErrorReason(Annotate(WithErrorInfo(absl::NotFoundError("gone"), "JOB_NOT_FOUND"), "job x: ")),
      "JOB_NOT_FOUND");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "never: ").ok());
}

// A shared check's error names the field at its path in the request at hand.
TEST(StatusTest, WithFieldPathNamesTheFieldAtItsPath) {
  const absl::Status bare = absl::InvalidArgumentError("bad ttl: seconds 1, nanos -1");
  const absl::Status placed = WithFieldPath(bare, "lease_ttl");
  EXPECT_EQ(placed.message(), bare.message());
  ASSERT_THAT(FieldViolations(placed), SizeIs(1));
  EXPECT_EQ(FieldViolations(placed)[0].field, "lease_ttl");
  EXPECT_EQ(ErrorReason(placed), "INVALID_FIELD");
  const absl::Status moved = WithFieldPath(InvalidField("job_id", "bad job_id"), "job.job_id");
  ASSERT_THAT(FieldViolations(moved), SizeIs(1));
  EXPECT_EQ(FieldViolations(moved)[0].field, "job.job_id");
  EXPECT_TRUE(absl::IsNotFound(WithFieldPath(absl::NotFoundError("no"), "job_id")));
  EXPECT_THAT(FieldViolations(WithFieldPath(absl::NotFoundError("no"), "job_id")), SizeIs(0));
}

TEST(StatusTest, FieldPathsJoinFieldsIndicesAndMapKeys) {
  EXPECT_EQ(FieldPath("spec", "group_size"), "spec.group_size");
  EXPECT_EQ(FieldPath("", "job_id"), "job_id");
  EXPECT_EQ(FieldPath("prompts[3]", ""), "prompts[3]");
  EXPECT_EQ(FieldPath(IndexPath("prompts", 3), "token_ids"), "prompts[3].token_ids");
  EXPECT_EQ(KeyPath("manifest.labels", "note"), "manifest.labels[\"note\"]");
  EXPECT_EQ(KeyPath("labels", "a\"b\\c"), "labels[\"a\\\"b\\\\c\"]");
}

}  // namespace
}  // namespace tandem
