#include "common/auth.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/ascii.h"
#include "common/channel.h"
#include "common/health_client.h"
#include "common/server_options.h"
#include "common/testing/http_get.h"
#include "common/testing/test_dir.h"
#include "common/testing/test_server.h"
#include "common/token_file.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using testing::EchoRequest;
using testing::EchoResponse;
using testing::EchoService;
using ::testing::HasSubstr;

constexpr char kToken[] = "s3cret-token-0123456789";

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
    options.auth_token = kToken;
    auto server = testing::StartEchoServer(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  testing::EchoServer server_;
};

TEST_F(AuthTest, RightTokenIsAccepted) {
  EXPECT_TRUE(CallEcho(Connect(server_.target(), kToken)).ok());
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
  options.auth_token = kToken;
  auto server = testing::StartEchoServer(options);
  ASSERT_TRUE(server.ok()) << server.status();
  ChannelOptions client{.target = server->target(),
                        .service_name = "tandem.testing.EchoService",
                        .auth_token = kToken};
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

  // A new generation: `certificate` (.pem and .key of the test certificates, or `key`'s .key)
  // as tls.crt and tls.key, `ca` as ca.crt, and the token.
  void Write(const std::string& certificate, const std::string& ca, const std::string& token,
             std::string key = "") {
    if (key.empty()) key = certificate;
    const std::string generation = absl::StrCat(dir_, "/generation-", ++generations_);
    std::filesystem::create_directories(generation);
    std::filesystem::copy_file(TestFile(certificate + ".pem"), generation + "/tls.crt");
    std::filesystem::copy_file(TestFile(key + ".key"), generation + "/tls.key");
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
  secret.Write("server", "ca.pem", "first-token-0123456789");
  ServerOptions options = testing::LoopbackOptions();
  options.tls = TlsFiles{secret.Path("tls.crt"), secret.Path("tls.key"), secret.Path("ca.crt")};
  options.auth_token_file = secret.Path("token");
  options.credentials_check_interval = absl::Milliseconds(10);
  options.previous_token_grace = absl::ZeroDuration();
  auto server = testing::StartEchoServer(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string target = server->target();
  EXPECT_TRUE(CallWith(target, "ca.pem", "client", "first-token-0123456789").ok());

  secret.Write("next_server", "other_ca.pem", "second-token-0123456789");
  absl::SleepFor(absl::Milliseconds(50));  // Past the check interval.
  const grpc::Status renewed =
      CallWith(target, "other_ca.pem", "next_client", "second-token-0123456789");
  EXPECT_TRUE(renewed.ok()) << renewed.error_message();
  EXPECT_EQ(CallWith(target, "ca.pem", "next_client", "second-token-0123456789").error_code(),
            grpc::StatusCode::UNAVAILABLE)
      << "the old CA did not sign the renewed server certificate";
  EXPECT_EQ(CallWith(target, "other_ca.pem", "client", "second-token-0123456789").error_code(),
            grpc::StatusCode::UNAVAILABLE)
      << "the renewed client CA did not sign the old client certificate";
  EXPECT_EQ(CallWith(target, "other_ca.pem", "next_client", "first-token-0123456789").error_code(),
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

// The expiry metric of the certificate the server at `metrics_port` serves, in Unix seconds.
absl::StatusOr<double> ServedCertificateExpiry(int metrics_port) {
  absl::StatusOr<std::string> metrics =
      testing::HttpGet(absl::StrCat("http://127.0.0.1:", metrics_port, "/metrics"));
  if (!metrics.ok()) return metrics.status();
  const std::string series = "tandem_tls_certificate_expiry_timestamp_seconds{service=\"echo\"} ";
  const size_t at = metrics->find(series);
  if (at == std::string::npos) return absl::NotFoundError("no certificate expiry series");
  return std::stod(metrics->substr(at + series.size()));
}

// A renewal whose key does not belong to its certificate is refused: the server keeps serving
// the certificate it had (clients that trust only the old CA still get through), and the
// expiry metric names that certificate's expiry (the test CA signs for ten years).
TEST(CredentialRotationTest, ARefusedRenewalKeepsTheServedCertificate) {
  MountedSecret secret(testing::FreshTestDir("refused-rotation"));
  secret.Write("server", "ca.pem", kToken);
  ServerOptions options = testing::LoopbackOptions();
  options.tls = TlsFiles{secret.Path("tls.crt"), secret.Path("tls.key"), ""};
  options.credentials_check_interval = absl::Milliseconds(10);
  auto server = testing::StartEchoServer(options);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE(CallWith(server->target(), "ca.pem", "client", "").ok());

  secret.Write("next_server", "ca.pem", kToken, /*key=*/"server");
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_TRUE(CallWith(server->target(), "ca.pem", "client", "").ok());
  EXPECT_EQ(CallWith(server->target(), "other_ca.pem", "client", "").error_code(),
            grpc::StatusCode::UNAVAILABLE);
  const absl::StatusOr<double> expiry = ServedCertificateExpiry(server->server->metrics_port());
  ASSERT_TRUE(expiry.ok()) << expiry.status();
  const double in_ten_years = absl::ToUnixSeconds(absl::Now() + absl::Hours(24 * 3650));
  EXPECT_NEAR(*expiry, in_ten_years, 2 * 86400);
}

TEST(TlsTest, AKeyThatIsNotTheCertificatesIsRefusedAtStart) {
  ServerOptions options = testing::LoopbackOptions();
  options.tls = TlsFiles{TestFile("server.pem"), TestFile("client.key"), ""};
  const auto server = testing::StartEchoServer(options);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(), HasSubstr("does not belong to the certificate"));
}

TEST(AcceptedTokensTest, ThePreviousTokenIsAcceptedForItsGrace) {
  const std::string dir = testing::FreshTestDir("tokens");
  std::ofstream(dir + "/token") << "old-token-0123456789\n";
  AcceptedTokens tokens(*TokenFile::Open(dir + "/token", absl::ZeroDuration()), absl::Hours(1));
  EXPECT_TRUE(tokens.Accepts("Bearer old-token-0123456789"));
  absl::SleepFor(absl::Milliseconds(20));  // A later modification time.
  std::ofstream(dir + "/token.next") << "new-token-0123456789\n";
  std::filesystem::rename(dir + "/token.next", dir + "/token");
  EXPECT_TRUE(tokens.Accepts("Bearer new-token-0123456789"));
  EXPECT_TRUE(tokens.Accepts("Bearer old-token-0123456789")) << "within the grace";
  EXPECT_FALSE(tokens.Accepts("Bearer other-token-0123456789"));
  EXPECT_FALSE(AcceptedTokens("fixed-token-0123456789").Accepts("Bearer old-token-0123456789"));
}

// A server whose token lives in a real file that the test rewrites while it serves.
class TokenReloadTest : public ::testing::Test {
 protected:
  static constexpr absl::Duration kInterval = absl::Milliseconds(100);

  void SetUp() override {
    dir_ = testing::FreshTestDir("token-reload");
    RewriteInPlace(kToken);
    ServerOptions options = testing::LoopbackOptions();
    options.auth_token_file = TokenPath();
    options.credentials_check_interval = kInterval;
    options.previous_token_grace = absl::Hours(1);
    auto server = testing::StartEchoServer(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  std::string TokenPath() const { return dir_ + "/token"; }

  // Truncates the file and writes `contents`, as `echo > token` does.
  void RewriteInPlace(const std::string& contents) const {
    std::ofstream(TokenPath(), std::ios::trunc) << contents;
  }

  grpc::StatusCode CallWithToken(const std::string& token) const {
    std::shared_ptr<grpc::Channel> channel = grpc::CreateChannel(
        server_.target(), grpc::InsecureChannelCredentials());  // Sends the header as given.
    grpc::ClientContext context;
    SetTimeout(context, absl::Seconds(10));
    context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    EchoRequest request;
    request.set_message("hi");
    EchoResponse response;
    return EchoService::NewStub(channel)->Echo(&context, request, &response).error_code();
  }

  // Waits until the server has surely looked at the file again (two intervals: the change
  // settles, then it is read).
  static void WaitForReload() { absl::SleepFor(3 * kInterval); }

  std::string dir_;
  testing::EchoServer server_;
};

TEST_F(TokenReloadTest, AnEmptyOrShortTokenIsNeverAccepted) {
  for (const std::string bad : {"", "\n", "   \t\n", "short-token"}) {
    RewriteInPlace(bad);
    WaitForReload();
    EXPECT_EQ(CallWithToken(""), grpc::StatusCode::UNAUTHENTICATED) << "file '" << bad << "'";
    EXPECT_EQ(CallWithToken(std::string(absl::StripAsciiWhitespace(bad))),
              grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(CallWithToken(kToken), grpc::StatusCode::OK) << "the last valid token stays";
  }
  RewriteInPlace("the-next-valid-token-42\n");
  WaitForReload();
  EXPECT_EQ(CallWithToken("the-next-valid-token-42"), grpc::StatusCode::OK);
  EXPECT_EQ(CallWithToken(""), grpc::StatusCode::UNAUTHENTICATED)
      << "nor during the previous token's grace";
}

// A rotation that writes the file in place in two parts: the first part is already a
// plausible token, but it is never accepted, because the change had not settled.
TEST_F(TokenReloadTest, AFileCaughtHalfWrittenNeverYieldsAPrefix) {
  const std::string next = "rotated-token-0123456789-abcdefghij";
  const std::string prefix = next.substr(0, 20);
  for (int round = 0; round < 3; ++round) {
    RewriteInPlace(kToken);
    WaitForReload();
    RewriteInPlace(prefix);
    const absl::Time pause_end = absl::Now() + kInterval / 2;
    while (absl::Now() < pause_end) {
      EXPECT_EQ(CallWithToken(prefix), grpc::StatusCode::UNAUTHENTICATED);
      absl::SleepFor(absl::Milliseconds(5));
    }
    std::ofstream(TokenPath(), std::ios::app) << next.substr(prefix.size());
    WaitForReload();
    EXPECT_EQ(CallWithToken(prefix), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(CallWithToken(next), grpc::StatusCode::OK);
  }
}

// Kubernetes' way: a new generation directory swapped in by a symlink rename. An empty token
// in the new generation (a Secret edited wrongly) is refused like an empty file.
TEST(TokenRotationTest, AnEmptyTokenInARenewedSecretIsRefused) {
  MountedSecret secret(testing::FreshTestDir("empty-rotation"));
  secret.Write("server", "ca.pem", "first-token-0123456789");
  ServerOptions options = testing::LoopbackOptions();
  options.auth_token_file = secret.Path("token");
  options.credentials_check_interval = absl::Milliseconds(10);
  auto server = testing::StartEchoServer(options);
  ASSERT_TRUE(server.ok()) << server.status();
  secret.Write("server", "ca.pem", "");
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(CallEcho(Connect(server->target(), "")).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(CallEcho(Connect(server->target(), "first-token-0123456789")).ok());
}

TEST(TokenRotationTest, AServerRefusesToStartWithAShortToken) {
  ServerOptions options = testing::LoopbackOptions();
  options.auth_token = "short";
  const auto server = testing::StartEchoServer(options);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(), HasSubstr("at least 16 bytes"));
}

// A client reading its token from a file keeps sending the last valid one when the file is
// emptied, so a botched rotation does not turn into calls without a token.
TEST(TokenRotationTest, AClientKeepsItsLastValidToken) {
  const std::string dir = testing::FreshTestDir("client-token");
  std::ofstream(dir + "/token") << "client-token-0123456789\n";
  auto file = TokenFile::Open(dir + "/token", absl::ZeroDuration());
  ASSERT_TRUE(file.ok()) << file.status();
  absl::SleepFor(absl::Milliseconds(20));
  std::ofstream(dir + "/token", std::ios::trunc) << "";
  EXPECT_EQ((*file)->Current().value, "client-token-0123456789");
  EXPECT_EQ((*file)->Current().generation, 0);
  std::ofstream(dir + "/token", std::ios::trunc) << "next-client-token-0123456789";
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ((*file)->Current().value, "next-client-token-0123456789");
  EXPECT_EQ((*file)->Current().generation, 1);
  std::ofstream(dir + "/empty") << " \n";
  const auto empty = TokenFile::Open(dir + "/empty", absl::ZeroDuration());
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
