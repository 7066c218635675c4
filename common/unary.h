#ifndef TANDEM_COMMON_UNARY_H_
#define TANDEM_COMMON_UNARY_H_

#include <utility>

#include "absl/status/statusor.h"
#include "common/status.h"
#include "grpcpp/support/server_callback.h"

namespace tandem {

// Finishes a unary callback RPC with a core function's result: the value becomes the response,
// an error becomes the gRPC status (same code, message kept).
template <typename Response>
grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context,
                                      absl::StatusOr<Response> result, Response* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (result.ok()) *response = *std::move(result);
  reactor->Finish(ToGrpcStatus(result.status()));
  return reactor;
}

}  // namespace tandem

#endif  // TANDEM_COMMON_UNARY_H_
