#include "common/checksummed_message.h"

#include "absl/base/internal/endian.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/checksum.h"

namespace tandem {
namespace {

constexpr size_t kChecksumBytes = 8;

}  // namespace

std::string EncodeChecksummed(absl::string_view magic,
                              const google::protobuf::MessageLite& message) {
  const std::string payload = message.SerializeAsString();
  char checksum[kChecksumBytes];
  absl::little_endian::Store64(checksum, Xxh3Checksum(payload));
  return absl::StrCat(magic, absl::string_view(checksum, kChecksumBytes), payload);
}

absl::Status DecodeChecksummed(absl::string_view magic, absl::string_view file,
                               google::protobuf::MessageLite& message) {
  if (!absl::StartsWith(file, magic)) {
    if (message.ParseFromArray(file.data(), static_cast<int>(file.size()))) {
      return absl::OkStatus();
    }
    return absl::DataLossError("neither a checksummed record nor a parsable message");
  }
  if (file.size() < magic.size() + kChecksumBytes) {
    return absl::DataLossError(absl::StrCat("truncated header (", file.size(), " bytes)"));
  }
  const absl::string_view payload = file.substr(magic.size() + kChecksumBytes);
  const uint64_t written = absl::little_endian::Load64(file.data() + magic.size());
  const uint64_t read = Xxh3Checksum(payload);
  if (read != written) {
    return absl::DataLossError(absl::StrCat("checksum mismatch (", file.size(),
                                            " bytes; written ", ChecksumToHex(written),
                                            ", read ", ChecksumToHex(read), ")"));
  }
  if (!message.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return absl::DataLossError("checksum matches but the message does not parse");
  }
  return absl::OkStatus();
}

}  // namespace tandem
