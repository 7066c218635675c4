#include "common/auth.h"

#include <openssl/crypto.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/served_certificate.h"
#include "common/sha256.h"
#include "common/status.h"
#include "grpc/grpc_security.h"
#include "spdlog/spdlog.h"

namespace tandem {
namespace {

absl::string_view SliceView(const grpc_slice& slice) {
  return {reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(slice)), GRPC_SLICE_LENGTH(slice)};
}

// State of the core auth-metadata processor; core frees it through Destroy when the
// credentials die, which may be after the C++ wrapper is gone.
struct TokenCheck {
  std::shared_ptr<AcceptedTokens> tokens;
  std::function<void()> on_rejected;

  static void Process(void* state, grpc_auth_context* /*context*/, const grpc_metadata* metadata,
                      size_t count, grpc_process_auth_metadata_done_cb done, void* user_data) {
    const auto* check = static_cast<const TokenCheck*>(state);
    absl::string_view path;
    absl::string_view authorization;
    for (size_t i = 0; i < count; ++i) {
      const absl::string_view key = SliceView(metadata[i].key);
      if (key == ":path") path = SliceView(metadata[i].value);
      if (key == "authorization") authorization = SliceView(metadata[i].value);
    }
    if (absl::StartsWith(path, kAuthExemptPrefix) || check->tokens->Accepts(authorization)) {
      done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_OK, nullptr);
      return;
    }
    if (check->on_rejected) check->on_rejected();
    const char* reason = authorization.empty() ? "missing 'authorization: Bearer <token>' metadata"
                                               : "bearer token does not match the server's token";
    done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_UNAUTHENTICATED, reason);
  }

  static void Destroy(void* state) { delete static_cast<TokenCheck*>(state); }
};

// Hands gRPC the certificate files' contents before a TLS handshake when they changed, so a
// renewed certificate (or client CA) is served without a restart. Files that do not make a
// servable pair are refused, named in the log, and the last good ones stay in service.
class CertificateFetcher {
 public:
  CertificateFetcher(std::unique_ptr<WatchedFiles> files,
                     std::function<void(absl::Time)> on_certificate_served)
      : files_(std::move(files)), on_certificate_served_(std::move(on_certificate_served)) {}

  static grpc_ssl_certificate_config_reload_status Fetch(
      void* self, grpc_ssl_server_certificate_config** config) {
    return static_cast<CertificateFetcher*>(self)->FetchChanged(config);
  }

 private:
  grpc_ssl_certificate_config_reload_status FetchChanged(
      grpc_ssl_server_certificate_config** config) {
    absl::MutexLock lock(&mutex_);
    const int64_t generation = files_->generation();
    if (generation == served_generation_ || generation == refused_generation_) {
      return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
    }
    const std::vector<std::string> pem = files_->Contents();  // Chain, key[, client CA].
    const absl::StatusOr<absl::Time> expiry =
        CheckServedCertificate(pem[0], pem[1], pem.size() > 2 ? pem[2] : "", absl::Now());
    if (!expiry.ok()) {
      spdlog::error("refusing the TLS certificate files as they changed ({}); {}",
                    std::string(expiry.status().message()),
                    served_generation_ >= 0 ? "still serving the previous ones" : "serving none");
      refused_generation_ = generation;
      return served_generation_ >= 0 ? GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED
                                     : GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_FAIL;
    }
    const grpc_ssl_pem_key_cert_pair pair{pem[1].c_str(), pem[0].c_str()};
    // gRPC's reload path asserts a root bundle even when clients are not asked for a
    // certificate; the server's own chain stands in then, and is never used.
    const std::string& client_ca = pem.size() > 2 ? pem[2] : pem[0];
    *config = grpc_ssl_server_certificate_config_create(client_ca.c_str(), &pair, 1);
    if (served_generation_ >= 0) {
      spdlog::info("serving renewed TLS certificate files (expiring {})",
                   absl::FormatTime(*expiry));
    }
    served_generation_ = generation;
    if (on_certificate_served_) on_certificate_served_(*expiry);
    return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
  }

  const std::unique_ptr<WatchedFiles> files_;
  const std::function<void(absl::Time)> on_certificate_served_;
  absl::Mutex mutex_;
  int64_t served_generation_ ABSL_GUARDED_BY(mutex_) = -1;
  int64_t refused_generation_ ABSL_GUARDED_BY(mutex_) = -1;
};

// Wraps core credentials so a token check can be attached to plaintext ones too; owns what
// the core credentials call back into (they die with the server, which this wrapper outlives).
class CoreServerCredentials : public grpc::ServerCredentials {
 public:
  CoreServerCredentials(grpc_server_credentials* core,
                        std::unique_ptr<CertificateFetcher> certificates)
      : core_(core), certificates_(std::move(certificates)) {}
  ~CoreServerCredentials() override { grpc_server_credentials_release(core_); }

  void SetAuthMetadataProcessor(
      const std::shared_ptr<grpc::AuthMetadataProcessor>& /*processor*/) override {
    // Tandem attaches its processor at construction; nothing else may replace it.
  }

 private:
  int AddPortToServer(const std::string& address, grpc_server* server) override {
    return grpc_server_add_http2_port(server, address.c_str(), core_);
  }

  grpc_server_credentials* const core_;
  const std::unique_ptr<CertificateFetcher> certificates_;
};

class BearerTokenInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(std::string header) : header_(std::move(header)) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", header_);
    }
    methods->Proceed();
  }

 private:
  const std::string header_;
};

}  // namespace

bool BearerTokenMatches(absl::string_view authorization_header, absl::string_view token) {
  const Sha256Digest expected = Sha256(absl::StrCat("Bearer ", token));
  const Sha256Digest actual = Sha256(authorization_header);
  return CRYPTO_memcmp(expected.data(), actual.data(), expected.size()) == 0;
}

AcceptedTokens::AcceptedTokens(std::string token) : fixed_(std::move(token)) {}

AcceptedTokens::AcceptedTokens(std::unique_ptr<TokenFile> file, absl::Duration grace)
    : file_(std::move(file)), grace_(grace) {}

bool AcceptedTokens::Accepts(absl::string_view authorization_header) {
  if (file_ == nullptr) return BearerTokenMatches(authorization_header, fixed_);
  TokenFile::Token token = file_->Current();
  absl::MutexLock lock(&mutex_);
  if (token.generation != generation_) {
    previous_ = std::move(current_);
    previous_until_ = generation_ < 0 ? absl::InfinitePast() : absl::Now() + grace_;
    current_ = std::move(token.value);
    generation_ = token.generation;
  }
  return BearerTokenMatches(authorization_header, current_) ||
         (absl::Now() < previous_until_ && BearerTokenMatches(authorization_header, previous_));
}

namespace {

// The tokens a server with `options` accepts; null when bearer-token auth is off.
absl::StatusOr<std::shared_ptr<AcceptedTokens>> AcceptedTokensOf(const ServerOptions& options) {
  if (!options.auth_token_file.empty()) {
    absl::StatusOr<std::unique_ptr<TokenFile>> file =
        TokenFile::Open(options.auth_token_file, options.credentials_check_interval);
    if (!file.ok()) return file.status();
    return std::make_shared<AcceptedTokens>(*std::move(file), options.previous_token_grace);
  }
  if (options.auth_token.empty()) return nullptr;
  if (absl::Status valid = CheckAuthToken(options.auth_token, "the server's auth token");
      !valid.ok()) {
    return valid;
  }
  return std::make_shared<AcceptedTokens>(options.auth_token);
}

// The certificate files of `options`, watched, once they make a servable pair.
absl::StatusOr<std::unique_ptr<WatchedFiles>> OpenCertificateFiles(const ServerOptions& options) {
  std::vector<std::string> paths = {options.tls->certificate_chain, options.tls->private_key};
  if (!options.tls->client_ca.empty()) paths.push_back(options.tls->client_ca);
  absl::StatusOr<std::unique_ptr<WatchedFiles>> files =
      WatchedFiles::Open(paths, options.credentials_check_interval);
  if (!files.ok()) return files.status();
  const std::vector<std::string> pem = (*files)->Contents();
  const absl::StatusOr<absl::Time> expiry =
      CheckServedCertificate(pem[0], pem[1], pem.size() > 2 ? pem[2] : "", absl::Now());
  if (!expiry.ok()) {
    return Annotate(expiry.status(), absl::StrCat("TLS files ", absl::StrJoin(paths, ", "), ": "));
  }
  return files;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerOptions& options, CredentialEvents events) {
  absl::StatusOr<std::shared_ptr<AcceptedTokens>> tokens = AcceptedTokensOf(options);
  if (!tokens.ok()) return tokens.status();
  std::unique_ptr<CertificateFetcher> certificates;
  grpc_server_credentials* core = nullptr;
  if (options.tls.has_value()) {
    absl::StatusOr<std::unique_ptr<WatchedFiles>> files = OpenCertificateFiles(options);
    if (!files.ok()) return files.status();
    const bool mutual = !options.tls->client_ca.empty();
    certificates = std::make_unique<CertificateFetcher>(*std::move(files),
                                                        std::move(events.on_certificate_served));
    core = grpc_ssl_server_credentials_create_with_options(
        grpc_ssl_server_credentials_create_options_using_config_fetcher(
            mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                   : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
            &CertificateFetcher::Fetch, certificates.get()));
  } else {
    core = grpc_insecure_server_credentials_create();
  }
  if (*tokens != nullptr) {
    auto* check = new TokenCheck{*std::move(tokens), std::move(events.on_rejected)};
    grpc_server_credentials_set_auth_metadata_processor(
        core, {&TokenCheck::Process, &TokenCheck::Destroy, check});
  }
  return std::make_shared<CoreServerCredentials>(core, std::move(certificates));
}

grpc::experimental::Interceptor* BearerTokenInterceptorFactory::CreateClientInterceptor(
    grpc::experimental::ClientRpcInfo* /*info*/) {
  return new BearerTokenInterceptor(Header());
}

std::string BearerTokenInterceptorFactory::Header() const {
  if (token_file_ == nullptr) return fixed_header_;
  return absl::StrCat("Bearer ", token_file_->Current().value);
}

}  // namespace tandem
