#ifndef TANDEM_COMMON_FINISHED_REACTOR_H_
#define TANDEM_COMMON_FINISHED_REACTOR_H_

#include "grpcpp/support/server_callback.h"

namespace tandem {

// A streaming reactor that finishes at once with `status` (e.g. a request rejected before any
// message); works for any streaming shape (server, client, bidi).
template <typename Reactor>
class FinishedReactor : public Reactor {
 public:
  explicit FinishedReactor(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace tandem

#endif  // TANDEM_COMMON_FINISHED_REACTOR_H_
