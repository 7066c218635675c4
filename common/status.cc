#include "common/status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

bool IsUtf8Continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

}  // namespace

std::string TruncateStatusMessage(absl::string_view message, size_t max_bytes) {
  if (message.size() <= max_bytes) return std::string(message);
  // The suffix length depends on the digits of the cut count; reserve the widest it can be.
  const std::string widest_suffix = absl::StrCat(" ...[", message.size(), " bytes truncated]");
  size_t keep = max_bytes > widest_suffix.size() ? max_bytes - widest_suffix.size() : 0;
  while (keep > 0 && IsUtf8Continuation(message[keep])) --keep;
  return absl::StrCat(message.substr(0, keep), " ...[", message.size() - keep, " bytes truncated]");
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      TruncateStatusMessage(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      TruncateStatusMessage(status.error_message()));
}

}  // namespace tandem
