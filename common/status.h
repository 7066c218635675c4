#ifndef TANDEM_COMMON_STATUS_H_
#define TANDEM_COMMON_STATUS_H_

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace tandem {

// Status messages travel in HTTP/2 trailers, which peers cap (8 KiB by default), so a long
// message is cut at this many bytes, on a UTF-8 character boundary, and says how much was cut.
inline constexpr size_t kMaxStatusMessageBytes = 4096;

// absl and gRPC share the canonical code numbering, so codes map one to one. The google.rpc
// error details a status carries as payloads (InvalidField's) travel as the gRPC status details
// (a google.rpc.Status in the grpc-status-details-bin trailer), and come back as payloads.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// The domain of Tandem's google.rpc.ErrorInfo reasons.
inline constexpr char kErrorDomain[] = "tandem";

// INVALID_ARGUMENT `message` about the request field at `field` (its dotted path from the
// request, e.g. "spec.group_size"), carrying a google.rpc.BadRequest field violation (field and
// message) and a google.rpc.ErrorInfo (reason INVALID_FIELD, metadata {"field": field}), so a
// client can tell which field was wrong without parsing the message.
absl::Status InvalidField(absl::string_view field, absl::string_view message);

// `status` with a google.rpc.ErrorInfo (domain kErrorDomain, `reason` in UPPER_SNAKE_CASE,
// stable per kind of error) that ToGrpcStatus sends in the status details.
absl::Status WithErrorInfo(absl::Status status, absl::string_view reason,
                           const std::vector<std::pair<std::string, std::string>>& metadata = {});

struct FieldViolation {
  std::string field;
  std::string description;
};
// The google.rpc.BadRequest field violations `status` carries; none when it carries no details.
std::vector<FieldViolation> FieldViolations(const absl::Status& status);
// The reason of the google.rpc.ErrorInfo `status` carries; empty when none.
std::string ErrorReason(const absl::Status& status);

// Returns `message` unchanged if it fits in `max_bytes`, else its longest UTF-8-clean prefix
// that fits together with a " ...[N bytes truncated]" suffix.
std::string TruncateStatusMessage(absl::string_view message,
                                  size_t max_bytes = kMaxStatusMessageBytes);

}  // namespace tandem

#endif  // TANDEM_COMMON_STATUS_H_
