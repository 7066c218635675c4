#ifndef TANDEM_SERVICES_WEIGHT_STORE_CLIENT_TESTING_WEIGHT_STORE_SERVER_H_
#define TANDEM_SERVICES_WEIGHT_STORE_CLIENT_TESTING_WEIGHT_STORE_SERVER_H_

// The real weight-store (the binary's core and gRPC front end) for other services' in-process
// tests and benchmarks, which host it on loopback: no fake where the real store can run. The
// only way outside services/weight_store reaches the server's code, and only from testonly
// targets.
#include <memory>

#include "common/testing/test_server.h"
#include "services/weight_store/weight_store_service.h"

namespace tandem::weight_store::testing {

// The weight-store's services (public API and UCX data plane) on loopback.
inline absl::StatusOr<tandem::testing::LoopbackServer> StartWeightStore(
    const WeightStoreOptions& options,
    const ServerOptions& server_options = tandem::testing::LoopbackOptions()) {
  absl::StatusOr<std::vector<HostedService>> services = WeightStoreServices(options);
  if (!services.ok()) return services.status();
  return tandem::testing::StartLoopbackServer("weight-store", *std::move(services),
                                              server_options);
}

}  // namespace tandem::weight_store::testing

#endif  // TANDEM_SERVICES_WEIGHT_STORE_CLIENT_TESTING_WEIGHT_STORE_SERVER_H_
