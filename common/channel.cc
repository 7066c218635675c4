#include "common/channel.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/token_file.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "grpcpp/support/channel_arguments.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

// How often, at most, a channel notices that its token file changed.
constexpr absl::Duration kTokenFileCheckInterval = absl::Seconds(1);
// How often gRPC reads a channel's certificate files again.
constexpr unsigned int kCertificateRefreshSeconds = 1;

using google::protobuf::MethodOptions;

std::string SecondsString(absl::Duration duration) {
  return absl::StrCat(absl::ToDoubleSeconds(duration), "s");
}

bool IsIdempotent(const google::protobuf::MethodDescriptor& method) {
  return method.options().idempotency_level() != MethodOptions::IDEMPOTENCY_UNKNOWN;
}

std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(
    const std::optional<ClientTls>& tls) {
  if (!tls.has_value()) return grpc::InsecureChannelCredentials();
  grpc::experimental::TlsChannelCredentialsOptions options;
  const bool roots = !tls->root_ca.empty(), identity = !tls->certificate_chain.empty();
  if (roots || identity) {
    // gRPC watches the files: a renewed certificate or CA is used by the next connection.
    options.set_certificate_provider(
        std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
            tls->private_key, tls->certificate_chain, tls->root_ca, kCertificateRefreshSeconds));
    if (roots) options.watch_root_certs();
    if (identity) options.watch_identity_key_cert_pairs();
  }
  return grpc::experimental::TlsCredentials(options);
}

}  // namespace

absl::StatusOr<std::string> RetryServiceConfig(const ChannelOptions& options) {
  std::vector<std::string> service_names = {options.service_name};
  service_names.insert(service_names.end(), options.also_services.begin(),
                       options.also_services.end());
  nlohmann::json names = nlohmann::json::array();
  for (const std::string& name : service_names) {
    const auto* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(name);
    if (service == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("service '", name, "' is not linked into this binary"));
    }
    for (int i = 0; i < service->method_count(); ++i) {
      if (IsIdempotent(*service->method(i))) {
        names.push_back(
            {{"service", service->full_name()}, {"method", service->method(i)->name()}});
      }
    }
  }
  nlohmann::json config = {{"methodConfig", nlohmann::json::array()}};
  if (!names.empty()) {
    config["methodConfig"].push_back({{"name", names},
                                      {"retryPolicy",
                                       {{"maxAttempts", options.max_attempts},
                                        {"initialBackoff", SecondsString(options.initial_backoff)},
                                        {"maxBackoff", SecondsString(options.max_backoff)},
                                        {"backoffMultiplier", 2},
                                        {"retryableStatusCodes", {"UNAVAILABLE"}}}}});
  }
  return config.dump();
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateChannel(const ChannelOptions& options) {
  auto service_config = RetryServiceConfig(options);
  if (!service_config.ok()) return service_config.status();
  grpc::ChannelArguments args;
  args.SetServiceConfigJSON(*service_config);
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 1);
  args.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  args.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_time)));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_timeout)));
  // Long streams (WatchJob, WatchVersions) sit idle between events; keep them probed.
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  if (options.max_reconnect_backoff.has_value()) {
    const int max_ms = static_cast<int>(absl::ToInt64Milliseconds(*options.max_reconnect_backoff));
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::min(max_ms, 1000));
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, std::min(max_ms, 1000));
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, max_ms);
  }
  if (options.tls.has_value() && !options.tls->server_name_override.empty()) {
    args.SetSslTargetNameOverride(options.tls->server_name_override);
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!options.auth_token_file.empty()) {
    absl::StatusOr<std::unique_ptr<TokenFile>> token_file =
        TokenFile::Open(options.auth_token_file, kTokenFileCheckInterval);
    if (!token_file.ok()) return token_file.status();
    interceptors.push_back(std::make_unique<BearerTokenInterceptorFactory>(*std::move(token_file)));
  } else if (!options.auth_token.empty()) {
    interceptors.push_back(std::make_unique<BearerTokenInterceptorFactory>(options.auth_token));
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      options.target, MakeChannelCredentials(options.tls), args, std::move(interceptors));
}

void SetTimeout(grpc::ClientContext& context, absl::Duration timeout) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

}  // namespace tandem
