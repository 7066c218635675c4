#include "common/auth.h"

#include <string>

#include "common/channel.h"
#include "common/health_client.h"
#include "common/server_options.h"
#include "common/testing/test_server.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using testing::EchoRequest;
using testing::EchoResponse;
using testing::EchoService;
using ::testing::HasSubstr;

std::string TestFile(const std::string& name) {
  return std::string(std::getenv("TEST_SRCDIR")) + "/tandem/common/testing/" + name;
}

std::string ReadTestFile(const std::string& name) { return *ReadSmallFile(TestFile(name)); }

grpc::Status CallEcho(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::ClientContext context;
  SetTimeout(context, absl::Seconds(10));
  EchoRequest request;
  request.set_message("hi");
  EchoResponse response;
  return EchoService::NewStub(channel)->Echo(&context, request, &response);
}

std::shared_ptr<grpc::Channel> Connect(const std::string& target, const std::string& token) {
  return *CreateChannel(
      {.target = target, .service_name = "tandem.testing.EchoService", .auth_token = token});
}

TEST(BearerTokenMatchesTest, ComparesTheWholeHeader) {
  EXPECT_TRUE(BearerTokenMatches("Bearer abc", "abc"));
  EXPECT_FALSE(BearerTokenMatches("Bearer abd", "abc"));
  EXPECT_FALSE(BearerTokenMatches("Bearer abcd", "abc"));
  EXPECT_FALSE(BearerTokenMatches("Bearer ab", "abc"));
  EXPECT_FALSE(BearerTokenMatches("abc", "abc"));
  EXPECT_FALSE(BearerTokenMatches("", "abc"));
}

class AuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options = testing::LoopbackOptions();
    options.auth_token = "s3cret";
    auto server = testing::StartEchoServer(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  testing::EchoServer server_;
};

TEST_F(AuthTest, RightTokenIsAccepted) {
  EXPECT_TRUE(CallEcho(Connect(server_.target(), "s3cret")).ok());
}

TEST_F(AuthTest, WrongTokenIsRejectedBeforeTheHandler) {
  const grpc::Status status = CallEcho(Connect(server_.target(), "guess"));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(status.error_message(), HasSubstr("does not match"));
  EXPECT_EQ(server_.echo->calls_started.load(), 0);
}

TEST_F(AuthTest, MissingTokenIsRejected) {
  const grpc::Status status = CallEcho(Connect(server_.target(), ""));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(status.error_message(), HasSubstr("missing 'authorization: Bearer <token>'"));
}

TEST_F(AuthTest, HealthIsExempt) {
  auto health =
      CheckHealth(Connect(server_.target(), ""), "tandem.testing.EchoService", absl::Seconds(10));
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, Health::kServing);
}

TEST(TlsTest, ServerCertificateIsVerifiedByTheClient) {
  ServerOptions options = testing::LoopbackOptions();
  options.tls = TlsFiles{ReadTestFile("server.pem"), ReadTestFile("server.key"), ""};
  options.auth_token = "s3cret";
  auto server = testing::StartEchoServer(options);
  ASSERT_TRUE(server.ok()) << server.status();
  ChannelOptions client{.target = server->target(),
                        .service_name = "tandem.testing.EchoService",
                        .auth_token = "s3cret"};
  client.tls = ClientTls{.root_ca = ReadTestFile("ca.pem"), .server_name_override = "localhost"};
  EXPECT_TRUE(CallEcho(*CreateChannel(client)).ok());

  client.tls->root_ca = ReadTestFile("other_ca.pem");  // Did not sign the server.
  EXPECT_EQ(CallEcho(*CreateChannel(client)).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST(TlsTest, MutualTlsRequiresAClientCertificate) {
  ServerOptions options = testing::LoopbackOptions();
  options.tls =
      TlsFiles{ReadTestFile("server.pem"), ReadTestFile("server.key"), ReadTestFile("ca.pem")};
  auto server = testing::StartEchoServer(options);
  ASSERT_TRUE(server.ok()) << server.status();
  ChannelOptions client{.target = server->target(), .service_name = "tandem.testing.EchoService"};
  client.tls = ClientTls{.root_ca = ReadTestFile("ca.pem"), .server_name_override = "localhost"};
  EXPECT_EQ(CallEcho(*CreateChannel(client)).error_code(), grpc::StatusCode::UNAVAILABLE);

  client.tls->certificate_chain = ReadTestFile("client.pem");
  client.tls->private_key = ReadTestFile("client.key");
  EXPECT_TRUE(CallEcho(*CreateChannel(client)).ok());
}

}  // namespace
}  // namespace tandem
