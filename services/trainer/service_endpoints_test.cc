#include "services/trainer/service_endpoints.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::trainer {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(RolloutReplicasTest, AListIsUsedAsItIs) {
  trainer::v1::ServiceEndpoints endpoints;
  endpoints.add_rollout("10.0.0.2:50052");
  endpoints.add_rollout("10.0.0.1:50052");
  auto replicas = RolloutReplicas(endpoints);
  ASSERT_TRUE(replicas.ok()) << replicas.status();
  EXPECT_THAT(*replicas, ElementsAre("10.0.0.2:50052", "10.0.0.1:50052"));
}

TEST(RolloutReplicasTest, EveryAddressOfAServiceIsOneReplicaOnItsPort) {
  trainer::v1::ServiceEndpoints endpoints;
  endpoints.set_rollout_service("localhost:50052");
  auto replicas = RolloutReplicas(endpoints);
  ASSERT_TRUE(replicas.ok()) << replicas.status();
  EXPECT_THAT(*replicas, Contains("127.0.0.1:50052"));
  for (const std::string& replica : *replicas) {
    EXPECT_TRUE(replica == "127.0.0.1:50052" || replica == "[::1]:50052") << replica;
  }
}

TEST(RolloutReplicasTest, AnAddressLiteralIsItsOwnOnlyReplica) {
  trainer::v1::ServiceEndpoints endpoints;
  endpoints.set_rollout_service("::1:50052");
  auto replicas = RolloutReplicas(endpoints);
  ASSERT_TRUE(replicas.ok()) << replicas.status();
  EXPECT_THAT(*replicas, ElementsAre("[::1]:50052"));
}

TEST(RolloutReplicasTest, AServiceThatResolvesToNothingIsUnavailableNamingIt) {
  trainer::v1::ServiceEndpoints endpoints;
  endpoints.set_rollout_service("no-such-service.invalid:50052");
  auto replicas = RolloutReplicas(endpoints);
  EXPECT_EQ(replicas.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(replicas.status().message(),
              HasSubstr("endpoints.rollout_service no-such-service.invalid:50052: no replica"));
}

TEST(ApplyDefaultEndpointsTest, RolloutAndRolloutServiceAreOneField) {
  trainer::v1::ServiceEndpoints defaults;
  defaults.add_rollout("10.0.0.1:50052");
  defaults.set_weight_store("store:50053");
  trainer::v1::ServiceEndpoints endpoints;
  endpoints.set_rollout_service("rollout-headless:50052");
  ApplyDefaultEndpoints(defaults, endpoints);
  EXPECT_TRUE(endpoints.rollout().empty());
  EXPECT_EQ(endpoints.rollout_service(), "rollout-headless:50052");
  EXPECT_EQ(endpoints.weight_store(), "store:50053");
  EXPECT_EQ(endpoints.router_replay(), "");
}

TEST(CheckServiceNameTest, NeedsANameAndAPort) {
  EXPECT_TRUE(CheckServiceName("rollout:50052").ok());
  EXPECT_EQ(CheckServiceName("rollout").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckServiceName("rollout:65536").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckServiceName(":1").code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::trainer
