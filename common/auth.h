#ifndef TANDEM_COMMON_AUTH_H_
#define TANDEM_COMMON_AUTH_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/server_options.h"
#include "common/token_file.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/client_interceptor.h"

namespace tandem {

// Calls to this prefix never need a token: Kubernetes probes and load balancers speak the
// standard health protocol without credentials.
inline constexpr absl::string_view kAuthExemptPrefix = "/grpc.health.v1.Health/";

// Constant-time check of an "authorization" header against "Bearer <token>". Both sides are
// hashed first so the comparison time does not depend on where, or whether, lengths differ.
bool BearerTokenMatches(absl::string_view authorization_header, absl::string_view token);

// The bearer token a server accepts: a fixed one, or the last valid token of its file, read
// again when the file changes (a renewed Secret; see TokenFile). After a change the previous
// token is still accepted for `grace`, so clients that have not read the new one yet are not
// cut off mid-rotation. Callers check a fixed token with CheckAuthToken first.
class AcceptedTokens {
 public:
  explicit AcceptedTokens(std::string token);
  AcceptedTokens(std::unique_ptr<TokenFile> file, absl::Duration grace);

  // Whether `authorization_header` is "Bearer <a token accepted now>" (constant time).
  bool Accepts(absl::string_view authorization_header);

 private:
  const std::string fixed_;
  const std::unique_ptr<TokenFile> file_;
  const absl::Duration grace_;
  absl::Mutex mutex_;
  int64_t generation_ ABSL_GUARDED_BY(mutex_) = -1;
  std::string current_ ABSL_GUARDED_BY(mutex_);
  std::string previous_ ABSL_GUARDED_BY(mutex_);
  absl::Time previous_until_ ABSL_GUARDED_BY(mutex_) = absl::InfinitePast();
};

// Server credentials for `options`: TLS or plaintext, mutual TLS when a client CA is set, and,
// when options.auth_token or auth_token_file is set, a bearer-token check on every call outside
// kAuthExemptPrefix. TLS files and the token file are read again when they change, checked at
// most every options.credentials_check_interval (certificates before a handshake, the token
// before a call); a file that cannot be read at start, or a token CheckAuthToken refuses, is
// INVALID_ARGUMENT naming it; a renewal that brings an invalid token or certificate is logged
// and ignored, the last valid one staying in force. The check runs
// in gRPC core before the call reaches any interceptor or handler, and a missing or wrong token
// fails with UNAUTHENTICATED. (A server interceptor cannot fail a call in gRPC 1.51, and
// InsecureServerCredentials() aborts on SetAuthMetadataProcessor, hence these credentials.)
// `events` are called from gRPC threads.
struct CredentialEvents {
  std::function<void()> on_rejected;  // Once per call refused for its token.
  // The expiry (notAfter) of each certificate put in service, at start and on every renewal.
  std::function<void(absl::Time)> on_certificate_served;
};
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerOptions& options, CredentialEvents events = {});

// Client side: adds "authorization: Bearer <token>" to every call of a channel. A client
// interceptor rather than call credentials, because gRPC drops call credentials on
// plaintext channels and the loopback deployment is plaintext.
// The token is fixed, or its file's last valid token (see TokenFile).
class BearerTokenInterceptorFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenInterceptorFactory(absl::string_view token)
      : fixed_header_(absl::StrCat("Bearer ", token)) {}
  explicit BearerTokenInterceptorFactory(std::unique_ptr<TokenFile> token_file)
      : token_file_(std::move(token_file)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* info) override;

 private:
  std::string Header() const;

  const std::string fixed_header_;  // "Bearer <token>", when the token is fixed.
  const std::unique_ptr<TokenFile> token_file_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_AUTH_H_
