#include "common/proto_time.h"

#include "google/protobuf/util/time_util.h"

namespace tandem {

using ::google::protobuf::util::TimeUtil;

google::protobuf::Timestamp ToTimestamp(absl::Time time) {
  return TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(time));
}

absl::Time FromTimestamp(const google::protobuf::Timestamp& timestamp) {
  return absl::FromUnixNanos(TimeUtil::TimestampToNanoseconds(timestamp));
}

}  // namespace tandem
