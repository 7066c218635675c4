#ifndef TANDEM_COMMON_TESTING_ERROR_DETAILS_H_
#define TANDEM_COMMON_TESTING_ERROR_DETAILS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/status.h"
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

}  // namespace tandem

#endif  // TANDEM_COMMON_TESTING_ERROR_DETAILS_H_
