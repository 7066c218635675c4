#ifndef TANDEM_COMMON_STATUS_H_
#define TANDEM_COMMON_STATUS_H_

#include <cstddef>
#include <cstdint>
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

// INVALID_ARGUMENT `message` about a request that is invalid as a whole, or about something no
// single field carries (so no google.rpc.BadRequest), with a google.rpc.ErrorInfo (domain
// kErrorDomain, `reason` in UPPER_SNAKE_CASE, stable per kind of error). A bad field is
// InvalidField's.
absl::Status InvalidRequest(absl::string_view reason, absl::string_view message);

// `status` with `prefix` put before its message, keeping its code and every payload (the error
// details), so that adding context to a detailed status never strips its details.
absl::Status Annotate(const absl::Status& status, absl::string_view prefix);

// `status`, when INVALID_ARGUMENT, as InvalidField(field, its message): for a check shared by
// many requests (identifiers, string sizes, durations, LoRA configs) that names the field by
// its own name, or gives no details at all, to name it by its path from this request's root.
// Its other payloads are dropped; any other status is returned unchanged.
absl::Status WithFieldPath(const absl::Status& status, absl::string_view field);

// Field paths from the request root, as InvalidField takes them: FieldPath("spec", "group_size")
// is "spec.group_size" (just the other when either is empty), IndexPath("prompts", 3) is
// "prompts[3]", KeyPath("labels", "key") is `labels["key"]` (a '"' or '\' in the key escaped).
std::string FieldPath(absl::string_view parent, absl::string_view field);
std::string IndexPath(absl::string_view list, int64_t index);
std::string KeyPath(absl::string_view map, absl::string_view key);

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
