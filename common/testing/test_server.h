#ifndef TANDEM_COMMON_TESTING_TEST_SERVER_H_
#define TANDEM_COMMON_TESTING_TEST_SERVER_H_

#include <memory>
#include <string>

#include "common/server.h"
#include "common/testing/echo_service.h"

namespace tandem::testing {

// A ServiceServer hosting the echo service on loopback, on OS-picked ports.
struct EchoServer {
  EchoServiceImpl* echo = nullptr;  // Owned by server.
  std::unique_ptr<ServiceServer> server;

  std::string target() const { return "127.0.0.1:" + std::to_string(server->port()); }
};

inline ServerOptions LoopbackOptions() {
  ServerOptions options;
  options.host = "127.0.0.1";
  options.drain_timeout = absl::Seconds(5);
  return options;
}

inline absl::StatusOr<EchoServer> StartEchoServer(const ServerOptions& options) {
  auto echo = std::make_unique<EchoServiceImpl>();
  EchoServer result;
  result.echo = echo.get();
  std::vector<HostedService> services;
  services.push_back({"tandem.testing.EchoService", std::move(echo)});
  auto server = ServiceServer::Start("echo", std::move(services), options);
  if (!server.ok()) return server.status();
  result.server = *std::move(server);
  result.server->SetReady();
  return result;
}

}  // namespace tandem::testing

#endif  // TANDEM_COMMON_TESTING_TEST_SERVER_H_
