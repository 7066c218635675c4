#include "common/status.h"

#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"

namespace tandem {
namespace {

bool IsUtf8Continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// Error details travel in HTTP/2 trailers too (base64, beside the message, which they repeat):
// with details, the message is cut to kMaxDetailedMessageBytes and a violation's field,
// description and metadata values to kMaxViolationBytes, so that a status this file makes
// stays within the 8 KiB of trailers peers accept (for ASCII messages; grpc-message
// percent-encodes the rest).
constexpr size_t kMaxDetailedMessageBytes = 2048;
constexpr size_t kMaxViolationBytes = 512;

constexpr absl::string_view kDetailTypePrefix = "type.googleapis.com/google.rpc.";

std::string TypeUrl(const google::protobuf::Message& message) {
  return absl::StrCat("type.googleapis.com/", message.GetDescriptor()->full_name());
}

// The payload of `status` holding a message of `T`'s type, parsed; nullopt if none.
template <typename T>
std::optional<T> Detail(const absl::Status& status) {
  T detail;
  const auto payload = status.GetPayload(TypeUrl(detail));
  if (!payload.has_value() || !detail.ParseFromString(std::string(*payload))) return std::nullopt;
  return detail;
}

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
  google::rpc::Status details;
  status.ForEachPayload([&](absl::string_view type_url, const absl::Cord& payload) {
    if (!absl::StartsWith(type_url, kDetailTypePrefix)) return;
    google::protobuf::Any& any = *details.add_details();
    any.set_type_url(std::string(type_url));
    any.set_value(std::string(payload));
  });
  const auto code = static_cast<grpc::StatusCode>(status.code());
  if (details.details().empty()) return grpc::Status(code, TruncateStatusMessage(status.message()));
  // The details repeat the message, which must read the same in both (clients compare them).
  const std::string message = TruncateStatusMessage(status.message(), kMaxDetailedMessageBytes);
  details.set_code(static_cast<int>(status.code()));
  details.set_message(message);
  return grpc::Status(code, message, details.SerializeAsString());
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  absl::Status converted(static_cast<absl::StatusCode>(status.error_code()),
                         TruncateStatusMessage(status.error_message()));
  google::rpc::Status details;
  if (!status.error_details().empty() && details.ParseFromString(status.error_details())) {
    for (const google::protobuf::Any& any : details.details()) {
      if (absl::StartsWith(any.type_url(), kDetailTypePrefix)) {
        converted.SetPayload(any.type_url(), absl::Cord(any.value()));
      }
    }
  }
  return converted;
}

absl::Status WithErrorInfo(absl::Status status, absl::string_view reason,
                           const std::vector<std::pair<std::string, std::string>>& metadata) {
  google::rpc::ErrorInfo info;
  info.set_reason(std::string(reason));
  info.set_domain(kErrorDomain);
  for (const auto& [key, value] : metadata) {
    (*info.mutable_metadata())[key] = TruncateStatusMessage(value, kMaxViolationBytes);
  }
  status.SetPayload(TypeUrl(info), absl::Cord(info.SerializeAsString()));
  return status;
}

absl::Status InvalidField(absl::string_view field, absl::string_view message) {
  absl::Status status = absl::InvalidArgumentError(message);
  google::rpc::BadRequest bad_request;
  google::rpc::BadRequest::FieldViolation& violation = *bad_request.add_field_violations();
  violation.set_field(TruncateStatusMessage(field, kMaxViolationBytes));
  violation.set_description(TruncateStatusMessage(message, kMaxViolationBytes));
  status.SetPayload(TypeUrl(bad_request), absl::Cord(bad_request.SerializeAsString()));
  return WithErrorInfo(std::move(status), "INVALID_FIELD", {{"field", std::string(field)}});
}

absl::Status InvalidRequest(absl::string_view reason, absl::string_view message) {
  return WithErrorInfo(absl::InvalidArgumentError(message), reason);
}

absl::Status Annotate(const absl::Status& status, absl::string_view prefix) {
  if (status.ok()) return status;
  absl::Status annotated(status.code(), absl::StrCat(prefix, status.message()));
  status.ForEachPayload([&](absl::string_view type_url, const absl::Cord& payload) {
    annotated.SetPayload(type_url, payload);
  });
  return annotated;
}

absl::Status WithFieldPath(const absl::Status& status, absl::string_view field) {
  if (!absl::IsInvalidArgument(status)) return status;
  return InvalidField(field, status.message());
}

std::string FieldPath(absl::string_view parent, absl::string_view field) {
  if (parent.empty()) return std::string(field);
  if (field.empty()) return std::string(parent);
  return absl::StrCat(parent, ".", field);
}

std::string IndexPath(absl::string_view list, int64_t index) {
  return absl::StrCat(list, "[", index, "]");
}

std::string KeyPath(absl::string_view map, absl::string_view key) {
  std::string path = absl::StrCat(map, "[\"");
  for (const char c : key) {
    if (c == '"' || c == '\\') path.push_back('\\');
    path.push_back(c);
  }
  path += "\"]";
  return path;
}

std::vector<FieldViolation> FieldViolations(const absl::Status& status) {
  std::vector<FieldViolation> violations;
  if (std::optional<google::rpc::BadRequest> bad_request = Detail<google::rpc::BadRequest>(status)) {
    for (const auto& violation : bad_request->field_violations()) {
      violations.push_back({violation.field(), violation.description()});
    }
  }
  return violations;
}

std::string ErrorReason(const absl::Status& status) {
  std::optional<google::rpc::ErrorInfo> info = Detail<google::rpc::ErrorInfo>(status);
  return info.has_value() ? info->reason() : "";
}

}  // namespace tandem
