#include "services/trainer/job/service_endpoints.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::trainer {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(RolloutReplicasTest, AListIsUsedAsItIs) {
  const ServiceEndpoints endpoints{.rollout = {"10.0.0.2:50052", "10.0.0.1:50052"}};
  auto replicas = RolloutReplicas(endpoints);
  ASSERT_TRUE(replicas.ok()) << replicas.status();
  EXPECT_THAT(*replicas, ElementsAre("10.0.0.2:50052", "10.0.0.1:50052"));
}

TEST(RolloutReplicasTest, EveryAddressOfAServiceIsOneReplicaOnItsPort) {
  const ServiceEndpoints endpoints{.rollout_service = "localhost:50052"};
  auto replicas = RolloutReplicas(endpoints);
  ASSERT_TRUE(replicas.ok()) << replicas.status();
  EXPECT_THAT(*replicas, Contains("127.0.0.1:50052"));
  for (const std::string& replica : *replicas) {
    EXPECT_TRUE(replica == "127.0.0.1:50052" || replica == "[::1]:50052") << replica;
  }
}

TEST(RolloutReplicasTest, AnAddressLiteralIsItsOwnOnlyReplica) {
  const ServiceEndpoints endpoints{.rollout_service = "::1:50052"};
  auto replicas = RolloutReplicas(endpoints);
  ASSERT_TRUE(replicas.ok()) << replicas.status();
  EXPECT_THAT(*replicas, ElementsAre("[::1]:50052"));
}

TEST(RolloutReplicasTest, AServiceThatResolvesToNothingIsUnavailableNamingIt) {
  const ServiceEndpoints endpoints{.rollout_service = "no-such-service.invalid:50052"};
  auto replicas = RolloutReplicas(endpoints);
  EXPECT_EQ(replicas.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(replicas.status().message(),
              HasSubstr("--rollout_service no-such-service.invalid:50052: no replica"));
}

// The trainer refuses to start on flags that cannot run a job, naming the flag.
TEST(CheckServiceEndpointsTest, ReplicasAndAWeightStoreAreNeededAndTheFlagIsNamed) {
  const ServiceEndpoints good{.rollout = {"10.0.0.1:50052"}, .weight_store = "store:50053"};
  EXPECT_TRUE(CheckServiceEndpoints(good).ok());
  ServiceEndpoints by_service = good;
  by_service.rollout.clear();
  by_service.rollout_service = "rollout-headless:50052";
  EXPECT_TRUE(CheckServiceEndpoints(by_service).ok());
  const auto refused = [](ServiceEndpoints endpoints, const char* flag) {
    const absl::Status status = CheckServiceEndpoints(endpoints);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << flag;
    EXPECT_THAT(status.message(), HasSubstr(flag));
  };
  ServiceEndpoints both = good;
  both.rollout_service = "rollout-headless:50052";
  refused(both, "--rollout and --rollout_service are exclusive");
  refused({.weight_store = "store:50053"}, "--rollout: 1..256 addresses");
  refused({.rollout = std::vector<std::string>(257, "10.0.0.1:50052"), .weight_store = "s:1"},
          "--rollout: 1..256 addresses");
  refused({.rollout = {""}, .weight_store = "store:50053"}, "--rollout: empty address");
  refused({.rollout_service = "rollout-headless", .weight_store = "s:1"}, "--rollout_service:");
  refused({.rollout = {"10.0.0.1:50052"}}, "--weight_store is required");
}

TEST(CheckServiceNameTest, NeedsANameAndAPort) {
  EXPECT_TRUE(CheckServiceName("rollout:50052").ok());
  EXPECT_EQ(CheckServiceName("rollout").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckServiceName("rollout:65536").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckServiceName(":1").code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::trainer
