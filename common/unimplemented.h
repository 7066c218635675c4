#ifndef TANDEM_COMMON_UNIMPLEMENTED_H_
#define TANDEM_COMMON_UNIMPLEMENTED_H_

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/server_callback.h"

namespace tandem {

// Answers for RPCs whose bodies a later release brings: UNIMPLEMENTED with a message naming
// the method, instead of gRPC's default empty message.
inline grpc::Status NotYetImplemented(absl::string_view method) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                      absl::StrCat(method, " is not implemented in this Tandem build yet"));
}

inline grpc::ServerUnaryReactor* FinishUnimplemented(grpc::CallbackServerContext* context,
                                                     absl::string_view method) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(NotYetImplemented(method));
  return reactor;
}

// A reactor that finishes at once; works for any streaming shape (server, client, bidi).
template <typename Reactor>
class FinishedReactor : public Reactor {
 public:
  explicit FinishedReactor(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

template <typename Reactor>
Reactor* FinishStreamUnimplemented(absl::string_view method) {
  return new FinishedReactor<Reactor>(NotYetImplemented(method));
}

}  // namespace tandem

#endif  // TANDEM_COMMON_UNIMPLEMENTED_H_
