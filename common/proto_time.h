#ifndef TANDEM_COMMON_PROTO_TIME_H_
#define TANDEM_COMMON_PROTO_TIME_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/timestamp.pb.h"

namespace tandem {

// absl::Time <-> google.protobuf.Timestamp, exact to the nanosecond.
google::protobuf::Timestamp ToTimestamp(absl::Time time);
absl::Time FromTimestamp(const google::protobuf::Timestamp& timestamp);

inline google::protobuf::Timestamp NowTimestamp() { return ToTimestamp(absl::Now()); }

}  // namespace tandem

#endif  // TANDEM_COMMON_PROTO_TIME_H_
