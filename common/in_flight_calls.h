#ifndef TANDEM_COMMON_IN_FLIGHT_CALLS_H_
#define TANDEM_COMMON_IN_FLIGHT_CALLS_H_

#include "common/call_tracker.h"
#include "grpcpp/support/server_interceptor.h"

namespace tandem {

// Counts a server's calls in progress, so that its drain knows when nothing is left to finish.
// Streams that only end with the server are not counted: the health service's Watch (probes
// and clients that follow serving status) and reflection sessions.
class InFlightCallsInterceptorFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  // `calls` outlives the server.
  explicit InFlightCallsInterceptorFactory(CallTracker& calls) : calls_(calls) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  CallTracker& calls_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_IN_FLIGHT_CALLS_H_
