#include "common/proto_time.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "google/protobuf/util/time_util.h"

namespace tandem {

using ::google::protobuf::util::TimeUtil;

google::protobuf::Timestamp ToTimestamp(absl::Time time) {
  return TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(time));
}

absl::Time FromTimestamp(const google::protobuf::Timestamp& timestamp) {
  return absl::FromUnixNanos(TimeUtil::TimestampToNanoseconds(timestamp));
}

google::protobuf::Duration ToDuration(absl::Duration duration) {
  absl::Duration nanos;
  google::protobuf::Duration proto;
  proto.set_seconds(absl::IDivDuration(duration, absl::Seconds(1), &nanos));
  proto.set_nanos(static_cast<int32_t>(absl::ToInt64Nanoseconds(nanos)));
  return proto;
}

absl::StatusOr<absl::Duration> FromDuration(const google::protobuf::Duration& duration,
                                            absl::string_view field) {
  const bool signs_agree = (duration.seconds() >= 0 && duration.nanos() >= 0) ||
                           (duration.seconds() <= 0 && duration.nanos() <= 0);
  if (duration.seconds() < TimeUtil::kDurationMinSeconds ||
      duration.seconds() > TimeUtil::kDurationMaxSeconds || duration.nanos() <= -1000000000 ||
      duration.nanos() >= 1000000000 || !signs_agree) {
    return InvalidField(field, absl::StrCat("bad ", field, ": seconds ", duration.seconds(),
                                            ", nanos ", duration.nanos()));
  }
  return absl::Seconds(duration.seconds()) + absl::Nanoseconds(duration.nanos());
}

}  // namespace tandem
