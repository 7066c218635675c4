#ifndef TANDEM_SERVICES_WEIGHT_STORE_CLIENT_TESTING_WEIGHT_STORE_SERVER_H_
#define TANDEM_SERVICES_WEIGHT_STORE_CLIENT_TESTING_WEIGHT_STORE_SERVER_H_

// The real weight-store (the binary's core and gRPC front end) for other services' in-process
// tests and benchmarks, which host it on loopback: no fake where the real store can run. The
// only way outside services/weight_store reaches the server's code, and only from testonly
// targets.
#include <memory>

#include "services/weight_store/weight_store_service.h"

namespace tandem::weight_store::testing {

inline absl::StatusOr<std::unique_ptr<grpc::Service>> NewWeightStoreService(
    const WeightStoreOptions& options) {
  auto service = WeightStoreServiceImpl::Create(options);
  if (!service.ok()) return service.status();
  return std::unique_ptr<grpc::Service>(*std::move(service));
}

}  // namespace tandem::weight_store::testing

#endif  // TANDEM_SERVICES_WEIGHT_STORE_CLIENT_TESTING_WEIGHT_STORE_SERVER_H_
