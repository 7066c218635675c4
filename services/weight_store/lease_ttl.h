#ifndef TANDEM_SERVICES_WEIGHT_STORE_LEASE_TTL_H_
#define TANDEM_SERVICES_WEIGHT_STORE_LEASE_TTL_H_

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/proto_time.h"
#include "common/status.h"

namespace tandem::weight_store {

// A lease's lifetime from a request's optional Duration field `name` (its path from the request
// root): 30 s when unset, else 1 s..600 s (INVALID_ARGUMENT naming the field, in its details
// too).
inline absl::StatusOr<absl::Duration> LeaseTtl(bool set, const google::protobuf::Duration& ttl,
                                               absl::string_view name) {
  if (!set) return absl::Seconds(30);
  absl::StatusOr<absl::Duration> duration = FromDuration(ttl, name);
  if (!duration.ok()) return WithFieldPath(duration.status(), name);
  if (*duration < absl::Seconds(1) || *duration > absl::Seconds(600)) {
    return InvalidField(
        name, absl::StrCat(name, " is ", absl::FormatDuration(*duration), "; allowed 1s..600s"));
  }
  return duration;
}

}  // namespace tandem::weight_store

#endif  // TANDEM_SERVICES_WEIGHT_STORE_LEASE_TTL_H_
