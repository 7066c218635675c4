#ifndef TANDEM_COMMON_CHECKSUMMED_MESSAGE_H_
#define TANDEM_COMMON_CHECKSUMMED_MESSAGE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message_lite.h"

namespace tandem {

// A protobuf message as a file that detects damage: `magic` (which names the kind of record,
// e.g. "TJOB"), the XXH3-64 of the serialized message (8 bytes, little-endian), the message.
std::string EncodeChecksummed(absl::string_view magic, const google::protobuf::MessageLite& message);

// Parses a file written by EncodeChecksummed into `message`. A file that does not start with
// `magic` was written before records carried a checksum and is accepted if it parses. DATA_LOSS
// saying what is wrong (truncated, "checksum mismatch", unparsable) otherwise.
absl::Status DecodeChecksummed(absl::string_view magic, absl::string_view file,
                               google::protobuf::MessageLite& message);

}  // namespace tandem

#endif  // TANDEM_COMMON_CHECKSUMMED_MESSAGE_H_
