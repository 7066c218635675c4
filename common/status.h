#ifndef TANDEM_COMMON_STATUS_H_
#define TANDEM_COMMON_STATUS_H_

#include <cstddef>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace tandem {

// Status messages travel in HTTP/2 trailers, which peers cap (8 KiB by default), so a long
// message is cut at this many bytes, on a UTF-8 character boundary, and says how much was cut.
inline constexpr size_t kMaxStatusMessageBytes = 4096;

// absl and gRPC share the canonical code numbering, so codes map one to one.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Returns `message` unchanged if it fits in `max_bytes`, else its longest UTF-8-clean prefix
// that fits together with a " ...[N bytes truncated]" suffix.
std::string TruncateStatusMessage(absl::string_view message,
                                  size_t max_bytes = kMaxStatusMessageBytes);

}  // namespace tandem

#endif  // TANDEM_COMMON_STATUS_H_
