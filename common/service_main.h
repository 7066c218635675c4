#ifndef TANDEM_COMMON_SERVICE_MAIN_H_
#define TANDEM_COMMON_SERVICE_MAIN_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/server.h"
#include "common/server_options.h"

namespace tandem {

// What distinguishes one Tandem service binary from another.
struct ServiceBinary {
  std::string name;  // "trainer", "rollout", "weight-store", "router-replay".
  std::string usage;
  ServiceDefaults defaults;
  // Builds the service implementations once flags are parsed and validated.
  std::function<absl::StatusOr<std::vector<HostedService>>(const ServerOptions&)> make_services;
};

// The whole life of a service process: parse and validate flags (exit 2 with a message on
// bad ones), start logging, serve, report ready, and drain gracefully on SIGTERM or SIGINT.
// Returns the process exit code.
int RunServiceMain(int argc, char** argv, const ServiceBinary& binary);

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVICE_MAIN_H_
