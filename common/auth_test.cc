#include "common/auth.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "common/channel.h"
#include "common/health_client.h"
#include "common/server_options.h"
#include "common/testing/test_dir.h"
#include "common/testing/test_server.h"
#include "common/watched_files.h"
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
  options.tls = TlsFiles{TestFile("server.pem"), TestFile("server.key"), ""};
  options.auth_token = "s3cret";
  auto server = testing::StartEchoServer(options);
  ASSERT_TRUE(server.ok()) << server.status();
  ChannelOptions client{.target = server->target(),
                        .service_name = "tandem.testing.EchoService",
                        .auth_token = "s3cret"};
  client.tls = ClientTls{.root_ca = TestFile("ca.pem"), .server_name_override = "localhost"};
  EXPECT_TRUE(CallEcho(*CreateChannel(client)).ok());

  client.tls->server_name_override = "not-the-server";  // Not a name the certificate holds.
  EXPECT_EQ(CallEcho(*CreateChannel(client)).error_code(), grpc::StatusCode::UNAVAILABLE);

  client.tls->server_name_override = "localhost";
  client.tls->root_ca = TestFile("other_ca.pem");  // Did not sign the server.
  EXPECT_EQ(CallEcho(*CreateChannel(client)).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST(TlsTest, MutualTlsRequiresAClientCertificate) {
  ServerOptions options = testing::LoopbackOptions();
  options.tls = TlsFiles{TestFile("server.pem"), TestFile("server.key"), TestFile("ca.pem")};
  auto server = testing::StartEchoServer(options);
  ASSERT_TRUE(server.ok()) << server.status();
  ChannelOptions client{.target = server->target(), .service_name = "tandem.testing.EchoService"};
  client.tls = ClientTls{.root_ca = TestFile("ca.pem"), .server_name_override = "localhost"};
  EXPECT_EQ(CallEcho(*CreateChannel(client)).error_code(), grpc::StatusCode::UNAVAILABLE);

  client.tls->certificate_chain = TestFile("client.pem");
  client.tls->private_key = TestFile("client.key");
  EXPECT_TRUE(CallEcho(*CreateChannel(client)).ok());
}

// A Secret as Kubernetes mounts it: the files live in a generation directory that a symlink
// names, and a renewal swaps the symlink in one rename.
class MountedSecret {
 public:
  explicit MountedSecret(std::string dir) : dir_(std::move(dir)) {}

  std::string Path(const std::string& file) const { return dir_ + "/current/" + file; }

  // A new generation: `certificate` (.pem and .key of the test certificates) as tls.crt and
  // tls.key, `ca` as ca.crt, and the token.
  void Write(const std::string& certificate, const std::string& ca, const std::string& token) {
    const std::string generation = absl::StrCat(dir_, "/generation-", ++generations_);
    std::filesystem::create_directories(generation);
    std::filesystem::copy_file(TestFile(certificate + ".pem"), generation + "/tls.crt");
    std::filesystem::copy_file(TestFile(certificate + ".key"), generation + "/tls.key");
    std::filesystem::copy_file(TestFile(ca), generation + "/ca.crt");
    std::ofstream(generation + "/token") << token << "\n";
    std::filesystem::create_directory_symlink(generation, dir_ + "/next");
    std::filesystem::rename(dir_ + "/next", dir_ + "/current");
  }

 private:
  const std::string dir_;
  int generations_ = 0;
};

grpc::Status CallWith(const std::string& target, const std::string& ca, const std::string& client,
                      const std::string& token) {
  ChannelOptions options{
      .target = target, .service_name = "tandem.testing.EchoService", .auth_token = token};
  options.tls = ClientTls{.root_ca = TestFile(ca),
                          .certificate_chain = TestFile(client + ".pem"),
                          .private_key = TestFile(client + ".key"),
                          .server_name_override = "localhost"};
  return CallEcho(*CreateChannel(options));
}

// Renewed certificates, client CA and token are served without a restart: a client with the
// new credentials gets through, one that trusts only the old CA does not, nor one with the old
// token once its grace is over.
TEST(CredentialRotationTest, ARenewedSecretIsServedWithoutARestart) {
  MountedSecret secret(testing::FreshTestDir("rotation"));
  secret.Write("server", "ca.pem", "first-token");
  ServerOptions options = testing::LoopbackOptions();
  options.tls = TlsFiles{secret.Path("tls.crt"), secret.Path("tls.key"), secret.Path("ca.crt")};
  options.auth_token_file = secret.Path("token");
  options.credentials_check_interval = absl::Milliseconds(10);
  options.previous_token_grace = absl::ZeroDuration();
  auto server = testing::StartEchoServer(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string target = server->target();
  EXPECT_TRUE(CallWith(target, "ca.pem", "client", "first-token").ok());

  secret.Write("next_server", "other_ca.pem", "second-token");
  absl::SleepFor(absl::Milliseconds(50));  // Past the check interval.
  const grpc::Status renewed = CallWith(target, "other_ca.pem", "next_client", "second-token");
  EXPECT_TRUE(renewed.ok()) << renewed.error_message();
  EXPECT_EQ(CallWith(target, "ca.pem", "next_client", "second-token").error_code(),
            grpc::StatusCode::UNAVAILABLE)
      << "the old CA did not sign the renewed server certificate";
  EXPECT_EQ(CallWith(target, "other_ca.pem", "client", "second-token").error_code(),
            grpc::StatusCode::UNAVAILABLE)
      << "the renewed client CA did not sign the old client certificate";
  EXPECT_EQ(CallWith(target, "other_ca.pem", "next_client", "first-token").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

// A client's own certificate and CA files renew too: a channel whose files did not fit the
// server gets through, without being made again, once they are renewed.
TEST(CredentialRotationTest, AChannelUsesItsRenewedCertificateFiles) {
  ServerOptions options = testing::LoopbackOptions();
  options.tls =
      TlsFiles{TestFile("next_server.pem"), TestFile("next_server.key"), TestFile("other_ca.pem")};
  auto server = testing::StartEchoServer(options);
  ASSERT_TRUE(server.ok()) << server.status();
  MountedSecret secret(testing::FreshTestDir("client-rotation"));
  secret.Write("client", "ca.pem", "");
  ChannelOptions client{.target = server->target(),
                        .service_name = "tandem.testing.EchoService",
                        .max_reconnect_backoff = absl::Milliseconds(100)};
  client.tls = ClientTls{.root_ca = secret.Path("ca.crt"),
                         .certificate_chain = secret.Path("tls.crt"),
                         .private_key = secret.Path("tls.key"),
                         .server_name_override = "localhost"};
  const std::shared_ptr<grpc::Channel> channel = *CreateChannel(client);
  EXPECT_EQ(CallEcho(channel).error_code(), grpc::StatusCode::UNAVAILABLE);

  secret.Write("next_client", "other_ca.pem", "");
  grpc::Status renewed;
  for (int i = 0; i < 50 && !(renewed = CallEcho(channel)).ok(); ++i) {
    absl::SleepFor(absl::Milliseconds(100));  // gRPC reads the files once a second.
  }
  EXPECT_TRUE(renewed.ok()) << renewed.error_message();
}

TEST(AcceptedTokensTest, ThePreviousTokenIsAcceptedForItsGrace) {
  const std::string dir = testing::FreshTestDir("tokens");
  std::ofstream(dir + "/token") << "old\n";
  AcceptedTokens tokens(*WatchedFiles::Open({dir + "/token"}, absl::ZeroDuration()),
                        absl::Hours(1));
  EXPECT_TRUE(tokens.Accepts("Bearer old"));
  absl::SleepFor(absl::Milliseconds(20));  // A later modification time.
  std::ofstream(dir + "/token.next") << "new\n";
  std::filesystem::rename(dir + "/token.next", dir + "/token");
  EXPECT_TRUE(tokens.Accepts("Bearer new"));
  EXPECT_TRUE(tokens.Accepts("Bearer old")) << "within the grace";
  EXPECT_FALSE(tokens.Accepts("Bearer other"));
  EXPECT_FALSE(AcceptedTokens("fixed").Accepts("Bearer old"));
}

}  // namespace
}  // namespace tandem
