#ifndef TANDEM_COMMON_AUTH_H_
#define TANDEM_COMMON_AUTH_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/server_options.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/client_interceptor.h"

namespace tandem {

// Calls to this prefix never need a token: Kubernetes probes and load balancers speak the
// standard health protocol without credentials.
inline constexpr absl::string_view kAuthExemptPrefix = "/grpc.health.v1.Health/";

// Constant-time check of an "authorization" header against "Bearer <token>". Both sides are
// hashed first so the comparison time does not depend on where, or whether, lengths differ.
bool BearerTokenMatches(absl::string_view authorization_header, absl::string_view token);

// Server credentials for `options`: TLS or plaintext, mutual TLS when a client CA is set, and,
// when options.auth_token is non-empty, a bearer-token check on every call outside
// kAuthExemptPrefix. The check runs in gRPC core before the call reaches any interceptor or
// handler, and a missing or wrong token fails with UNAUTHENTICATED. (A server interceptor
// cannot fail a call in gRPC 1.51, and InsecureServerCredentials() aborts on
// SetAuthMetadataProcessor, hence these credentials.) `on_rejected` runs once per rejected
// call, from a gRPC thread.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(
    const ServerOptions& options, std::function<void()> on_rejected = nullptr);

// Client side: adds "authorization: Bearer <token>" to every call of a channel. A client
// interceptor rather than call credentials, because gRPC drops call credentials on
// plaintext channels and the loopback deployment is plaintext.
class BearerTokenInterceptorFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenInterceptorFactory(absl::string_view token)
      : header_(absl::StrCat("Bearer ", token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* info) override;

 private:
  const std::string header_;  // "Bearer <token>", built once per channel.
};

}  // namespace tandem

#endif  // TANDEM_COMMON_AUTH_H_
