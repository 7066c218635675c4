#ifndef TANDEM_COMMON_PROTO_TIME_H_
#define TANDEM_COMMON_PROTO_TIME_H_

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/duration.pb.h"
#include "google/protobuf/timestamp.pb.h"

namespace tandem {

// absl::Time <-> google.protobuf.Timestamp, exact to the nanosecond.
google::protobuf::Timestamp ToTimestamp(absl::Time time);
absl::Time FromTimestamp(const google::protobuf::Timestamp& timestamp);

inline google::protobuf::Timestamp NowTimestamp() { return ToTimestamp(absl::Now()); }

// absl::Duration <-> google.protobuf.Duration, exact to the nanosecond. FromDuration refuses
// (INVALID_ARGUMENT naming `field`, its path from the request root, in the message and in the
// details) what the Duration type forbids: nanos outside (-1e9, 1e9), a sign differing from the
// seconds', |seconds| over 10,000 years.
google::protobuf::Duration ToDuration(absl::Duration duration);
absl::StatusOr<absl::Duration> FromDuration(const google::protobuf::Duration& duration,
                                            absl::string_view field);

}  // namespace tandem

#endif  // TANDEM_COMMON_PROTO_TIME_H_
