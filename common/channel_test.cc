#include "common/channel.h"

#include "common/testing/test_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using testing::EchoRequest;
using testing::EchoResponse;
using testing::EchoService;
using ::testing::HasSubstr;

TEST(RetryServiceConfigTest, ListsOnlyIdempotentMethods) {
  auto config = RetryServiceConfig({.service_name = "tandem.testing.EchoService"});
  ASSERT_TRUE(config.ok()) << config.status();
  const nlohmann::json json = nlohmann::json::parse(*config);
  const nlohmann::json& names = json["methodConfig"][0]["name"];
  ASSERT_EQ(names.size(), 1u);
  EXPECT_EQ(names[0]["method"], "Echo");
  EXPECT_EQ(json["methodConfig"][0]["retryPolicy"]["retryableStatusCodes"][0], "UNAVAILABLE");
}

// A channel to a server that hosts several services retries each one's idempotent methods.
TEST(RetryServiceConfigTest, CoversTheOtherServicesOfTheChannel) {
  auto config = RetryServiceConfig(
      {.service_name = "grpc.health.v1.Health", .also_services = {"tandem.testing.EchoService"}});
  ASSERT_TRUE(config.ok()) << config.status();
  const nlohmann::json names = nlohmann::json::parse(*config)["methodConfig"][0]["name"];
  EXPECT_THAT(names.dump(),
              HasSubstr(R"({"method":"Echo","service":"tandem.testing.EchoService"})"));
  EXPECT_EQ(RetryServiceConfig({.service_name = "tandem.testing.EchoService",
                                .also_services = {"tandem.v9.Missing"}})
                .status()
                .code(),
            absl::StatusCode::kNotFound);
}

TEST(RetryServiceConfigTest, UnknownServiceIsNotFound) {
  auto config = RetryServiceConfig({.service_name = "tandem.trainer.v1.NoSuchService"});
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(config.status().message(), HasSubstr("tandem.trainer.v1.NoSuchService"));
}

class RetryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = testing::StartEchoServer(testing::LoopbackOptions());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ =
        *CreateChannel({.target = server_.target(), .service_name = "tandem.testing.EchoService"});
  }

  testing::EchoServer server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(RetryTest, IdempotentCallIsRetriedOnUnavailable) {
  grpc::ClientContext context;
  SetTimeout(context, absl::Seconds(10));
  EchoRequest request;
  request.set_message("again");
  request.set_fail_attempts(2);
  EchoResponse response;
  const grpc::Status status = EchoService::NewStub(channel_)->Echo(&context, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.message(), "again");
  EXPECT_EQ(server_.echo->calls_started.load(), 3);
}

TEST_F(RetryTest, NonIdempotentCallIsNeverRetried) {
  grpc::ClientContext context;
  SetTimeout(context, absl::Seconds(10));
  EchoRequest request;
  request.set_fail_attempts(1);
  EchoResponse response;
  const grpc::Status status = EchoService::NewStub(channel_)->Append(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(server_.echo->calls_started.load(), 1);
}

TEST_F(RetryTest, DeadlineIsEnforced) {
  grpc::ClientContext context;
  SetTimeout(context, absl::Milliseconds(100));
  EchoRequest request;
  request.set_delay_ms(1000);
  EchoResponse response;
  const grpc::Status status = EchoService::NewStub(channel_)->Echo(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
}

}  // namespace
}  // namespace tandem
