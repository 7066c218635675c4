#include "services/rollout/relay_upstream.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::rollout {
namespace {

using ::testing::HasSubstr;

TEST(RelayUpstreamTest, AFixedAddressIsKept) {
  EXPECT_EQ(*RelayUpstream("10.0.0.7:50052", -1), "10.0.0.7:50052");
  EXPECT_EQ(*RelayUpstream("10.0.0.7:50052", 3), "10.0.0.7:50052");
  EXPECT_EQ(*RelayUpstream("", -1), "");
}

TEST(RelayUpstreamTest, EachReplicaReadsFromTheOneBeforeItAndTheFirstFromTheStore) {
  constexpr char kChain[] = "tandem-rollout-{previous}.tandem-rollout-headless:50052";
  EXPECT_EQ(*RelayUpstream(kChain, 0), "");
  EXPECT_EQ(*RelayUpstream(kChain, 1), "tandem-rollout-0.tandem-rollout-headless:50052");
  EXPECT_EQ(*RelayUpstream(kChain, 12), "tandem-rollout-11.tandem-rollout-headless:50052");
}

TEST(RelayUpstreamTest, ThePreviousReplicaNeedsAnIndex) {
  const absl::StatusOr<std::string> upstream = RelayUpstream("r-{previous}:50052", -1);
  EXPECT_EQ(upstream.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(upstream.status().message(), HasSubstr("--replica_index"));
}

}  // namespace
}  // namespace tandem::rollout
