#include "common/server_options.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "common/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_DECLARE_FLAG(int, port);
ABSL_DECLARE_FLAG(int, metrics_port);
ABSL_DECLARE_FLAG(std::string, auth_token_file);
ABSL_DECLARE_FLAG(std::string, tls_cert);
ABSL_DECLARE_FLAG(std::string, tls_key);
ABSL_DECLARE_FLAG(std::string, tls_client_ca);
ABSL_DECLARE_FLAG(int64_t, max_message_bytes);
ABSL_DECLARE_FLAG(absl::Duration, drain_timeout);
ABSL_DECLARE_FLAG(absl::Duration, drain_delay);
ABSL_DECLARE_FLAG(std::string, log_level);

namespace tandem {
namespace {

using ::testing::HasSubstr;

constexpr ServiceDefaults kDefaults{50051, 9451, 64 << 20};

class ServerOptionsTest : public ::testing::Test {
 protected:
  void SetUp() override { unsetenv("TANDEM_AUTH_TOKEN"); }

  std::string WriteFile(const std::string& name, const std::string& contents) {
    const std::string path = ::testing::TempDir() + "/" + name;
    std::ofstream(path) << contents;
    return path;
  }

  void ExpectRejected(const std::string& needle) {
    auto options = ServerOptionsFromFlags(kDefaults);
    ASSERT_FALSE(options.ok());
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(options.status().message(), HasSubstr(needle));
  }

  absl::FlagSaver saver_;  // Restores every flag after each test.
};

TEST_F(ServerOptionsTest, DefaultsComeFromTheService) {
  auto options = ServerOptionsFromFlags(kDefaults);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->port, 50051);
  EXPECT_EQ(options->metrics_port, 9451);
  EXPECT_EQ(options->max_message_bytes, 64 << 20);
  EXPECT_TRUE(options->auth_token.empty());
  EXPECT_FALSE(options->tls.has_value());
}

TEST_F(ServerOptionsTest, PortOutOfRangeIsRejected) {
  absl::SetFlag(&FLAGS_port, 70000);
  ExpectRejected("--port=70000 is not a port");
}

TEST_F(ServerOptionsTest, SamePortForGrpcAndMetricsIsRejected) {
  absl::SetFlag(&FLAGS_port, 7000);
  absl::SetFlag(&FLAGS_metrics_port, 7000);
  ExpectRejected("--port and --metrics_port are both 7000");
}

TEST_F(ServerOptionsTest, TinyMessageLimitIsRejected) {
  absl::SetFlag(&FLAGS_max_message_bytes, 100);
  ExpectRejected("--max_message_bytes=100 is outside");
}

TEST_F(ServerOptionsTest, NonPositiveDrainTimeoutIsRejected) {
  absl::SetFlag(&FLAGS_drain_timeout, absl::ZeroDuration());
  ExpectRejected("--drain_timeout=0 must be positive");
}

TEST_F(ServerOptionsTest, NegativeDrainDelayIsRejected) {
  absl::SetFlag(&FLAGS_drain_delay, absl::Seconds(-1));
  ExpectRejected("--drain_delay=-1s must not be negative");
}

TEST_F(ServerOptionsTest, TokenComesFromFileWithWhitespaceStripped) {
  absl::SetFlag(&FLAGS_auth_token_file, WriteFile("token", "  s3cret-token-0123456789\n"));
  auto options = ServerOptionsFromFlags(kDefaults);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->auth_token, "s3cret-token-0123456789");
}

TEST_F(ServerOptionsTest, TokenComesFromEnvironmentWhenNoFile) {
  setenv("TANDEM_AUTH_TOKEN", "from-env-0123456789", 1);
  auto options = ServerOptionsFromFlags(kDefaults);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->auth_token, "from-env-0123456789");
}

TEST_F(ServerOptionsTest, EmptyOrMissingTokenFileIsRejected) {
  absl::SetFlag(&FLAGS_auth_token_file, WriteFile("empty_token", "\n"));
  ExpectRejected("is empty");
  absl::SetFlag(&FLAGS_auth_token_file, WriteFile("short_token", " short-token \n"));
  ExpectRejected("holds a 11-byte token; tokens need at least 16 bytes");
  absl::SetFlag(&FLAGS_auth_token_file, WriteFile("spaced_token", "two halves of a token\n"));
  ExpectRejected("outside visible ASCII (byte 32)");
  absl::SetFlag(&FLAGS_auth_token_file, "");
  setenv("TANDEM_AUTH_TOKEN", "short", 1);
  ExpectRejected("$TANDEM_AUTH_TOKEN holds a 5-byte token");
  absl::SetFlag(&FLAGS_auth_token_file, "/nonexistent/token");
  ExpectRejected("cannot read file '/nonexistent/token'");
}

TEST_F(ServerOptionsTest, TlsNeedsCertificateAndKey) {
  absl::SetFlag(&FLAGS_tls_cert, WriteFile("cert.pem", "x"));
  ExpectRejected("TLS needs both --tls_cert and --tls_key");
}

TEST_F(ServerOptionsTest, ClientCaWithoutServerCertificateIsRejected) {
  absl::SetFlag(&FLAGS_tls_client_ca, WriteFile("ca.pem", "x"));
  ExpectRejected("--tls_client_ca needs --tls_cert and --tls_key");
}

TEST_F(ServerOptionsTest, UnknownLogLevelIsRejected) {
  absl::SetFlag(&FLAGS_log_level, "chatty");
  const absl::Status status = InitLogging("test");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("--log_level=chatty"));
}

}  // namespace
}  // namespace tandem
