#include "common/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <array>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpc/grpc_security.h"

namespace tandem {
namespace {

using Sha256 = std::array<unsigned char, 32>;

Sha256 HashOf(absl::string_view bytes) {
  Sha256 digest{};
  unsigned int length = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest.data(), &length, EVP_sha256(), nullptr);
  return digest;
}

absl::string_view SliceView(const grpc_slice& slice) {
  return {reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(slice)), GRPC_SLICE_LENGTH(slice)};
}

// State of the core auth-metadata processor; core frees it through Destroy when the
// credentials die, which may be after the C++ wrapper is gone.
struct TokenCheck {
  std::string token;
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
    if (absl::StartsWith(path, kAuthExemptPrefix) ||
        BearerTokenMatches(authorization, check->token)) {
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

// Wraps core credentials so a token check can be attached to plaintext ones too.
class CoreServerCredentials : public grpc::ServerCredentials {
 public:
  explicit CoreServerCredentials(grpc_server_credentials* core) : core_(core) {}
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
};

grpc_server_credentials* MakeCoreCredentials(const std::optional<TlsFiles>& tls) {
  if (!tls.has_value()) return grpc_insecure_server_credentials_create();
  grpc_ssl_pem_key_cert_pair pair{tls->private_key.c_str(), tls->certificate_chain.c_str()};
  const bool mutual = !tls->client_ca.empty();
  return grpc_ssl_server_credentials_create_ex(
      mutual ? tls->client_ca.c_str() : nullptr, &pair, 1,
      mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
             : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
      nullptr);
}

class BearerTokenInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(const std::string& header) : header_(header) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", header_);
    }
    methods->Proceed();
  }

 private:
  const std::string& header_;
};

}  // namespace

bool BearerTokenMatches(absl::string_view authorization_header, absl::string_view token) {
  const Sha256 expected = HashOf(absl::StrCat("Bearer ", token));
  const Sha256 actual = HashOf(authorization_header);
  return CRYPTO_memcmp(expected.data(), actual.data(), expected.size()) == 0;
}

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const ServerOptions& options,
                                                               std::function<void()> on_rejected) {
  grpc_server_credentials* core = MakeCoreCredentials(options.tls);
  if (!options.auth_token.empty()) {
    auto* check = new TokenCheck{options.auth_token, std::move(on_rejected)};
    grpc_server_credentials_set_auth_metadata_processor(
        core, {&TokenCheck::Process, &TokenCheck::Destroy, check});
  }
  return std::make_shared<CoreServerCredentials>(core);
}

grpc::experimental::Interceptor* BearerTokenInterceptorFactory::CreateClientInterceptor(
    grpc::experimental::ClientRpcInfo* /*info*/) {
  return new BearerTokenInterceptor(header_);
}

}  // namespace tandem
