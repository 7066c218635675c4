#include "common/proto_time.h"

#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

TEST(ProtoTimeTest, DurationsRoundTripToTheNanosecond) {
  for (const absl::Duration duration :
       {absl::ZeroDuration(), absl::Nanoseconds(1), absl::Seconds(30) + absl::Nanoseconds(7),
        -absl::Milliseconds(1500), absl::Hours(24 * 365 * 9000)}) {
    const absl::StatusOr<absl::Duration> back = FromDuration(ToDuration(duration), "ttl");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, duration);
  }
  EXPECT_EQ(ToDuration(-absl::Milliseconds(1500)).nanos(), -500000000);
}

TEST(ProtoTimeTest, WhatTheDurationTypeForbidsIsRefusedNamingTheField) {
  google::protobuf::Duration bad;
  for (const auto& [seconds, nanos] : std::vector<std::pair<int64_t, int32_t>>{
           {1, -1}, {-1, 1}, {0, 1000000000}, {0, -1000000000}, {315576000001, 0}}) {
    bad.set_seconds(seconds);
    bad.set_nanos(nanos);
    const absl::StatusOr<absl::Duration> refused = FromDuration(bad, "request.ttl");
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument)
        << seconds << " " << nanos;
    EXPECT_THAT(refused.status().message(), HasSubstr("bad request.ttl"));
  }
}

}  // namespace
}  // namespace tandem
