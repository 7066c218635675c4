#ifndef TANDEM_COMMON_TESTING_ERROR_DETAILS_H_
#define TANDEM_COMMON_TESTING_ERROR_DETAILS_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/status.h"
#include "grpcpp/support/status.h"
#include "gtest/gtest.h"

namespace tandem {

// Expects INVALID_ARGUMENT whose details name `reason` (google.rpc.ErrorInfo) and, unless
// `field` is empty, exactly one google.rpc.BadRequest violation of `field` (its path from the
// request root); with an empty `field`, none.
inline void ExpectInvalidArgumentDetails(const absl::Status& status, const std::string& reason,
                                         const std::string& field) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(ErrorReason(status), reason) << status;
  const std::vector<FieldViolation> violations = FieldViolations(status);
  if (field.empty()) {
    EXPECT_TRUE(violations.empty()) << status;
  } else if (violations.size() != 1) {
    ADD_FAILURE() << "want one field violation, got " << violations.size() << ": " << status;
  } else {
    EXPECT_EQ(violations[0].field, field) << status;
  }
}

// One documented rule of an RPC: a call that breaks it, and the details its refusal must carry.
struct InvalidArgumentCase {
  std::string name;
  std::function<grpc::Status()> call;
  std::string field;  // Empty: no BadRequest, only the reason.
  std::string reason = "INVALID_FIELD";
};

// Makes every case's call and expects its refusal's details (ExpectInvalidArgumentDetails).
inline void ExpectEachRefusedWithDetails(const std::vector<InvalidArgumentCase>& cases) {
  for (const InvalidArgumentCase& c : cases) {
    SCOPED_TRACE(c.name);
    ExpectInvalidArgumentDetails(FromGrpcStatus(c.call()), c.reason, c.field);
  }
}

}  // namespace tandem

#endif  // TANDEM_COMMON_TESTING_ERROR_DETAILS_H_
