#ifndef TANDEM_COMMON_TESTING_TEST_SERVER_H_
#define TANDEM_COMMON_TESTING_TEST_SERVER_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/server.h"
#include "common/testing/echo_service.h"

namespace tandem::testing {

// Server options for in-process test servers: loopback, OS-picked ports.
inline ServerOptions LoopbackOptions() {
  ServerOptions options;
  options.host = "127.0.0.1";
  options.drain_timeout = absl::Seconds(5);
  return options;
}

// One service hosted by a ServiceServer on loopback, told it may serve (it reports SERVING once
// the service's readiness probe, if any, passes).
struct LoopbackServer {
  std::unique_ptr<ServiceServer> server;
  std::string proto_name;

  std::string target() const { return absl::StrCat("127.0.0.1:", server->port()); }
  // A client channel to it (retries by the service's idempotency options).
  std::shared_ptr<grpc::Channel> Channel() const {
    return *CreateChannel({.target = target(), .service_name = proto_name});
  }
};

// Services hosted together, as one binary hosts them; the first names the channel's retries.
inline absl::StatusOr<LoopbackServer> StartLoopbackServer(
    const std::string& name, std::vector<HostedService> services,
    const ServerOptions& options = LoopbackOptions()) {
  LoopbackServer result{.proto_name = services.empty() ? "" : services.front().proto_name};
  auto server = ServiceServer::Start(name, std::move(services), options);
  if (!server.ok()) return server.status();
  result.server = *std::move(server);
  result.server->SetReady();
  return result;
}

inline absl::StatusOr<LoopbackServer> StartLoopbackServer(const std::string& name,
                                                          HostedService service,
                                                          const ServerOptions& options =
                                                              LoopbackOptions()) {
  std::vector<HostedService> services;
  services.push_back(std::move(service));
  return StartLoopbackServer(name, std::move(services), options);
}

// The echo service on loopback, with a handle to the service for assertions.
struct EchoServer {
  EchoServiceImpl* echo = nullptr;  // Owned by server.
  std::unique_ptr<ServiceServer> server;

  std::string target() const { return "127.0.0.1:" + std::to_string(server->port()); }
};

inline absl::StatusOr<EchoServer> StartEchoServer(const ServerOptions& options) {
  auto echo = std::make_unique<EchoServiceImpl>();
  EchoServiceImpl* raw = echo.get();
  auto started =
      StartLoopbackServer("echo", {"tandem.testing.EchoService", std::move(echo)}, options);
  if (!started.ok()) return started.status();
  return EchoServer{.echo = raw, .server = std::move(started->server)};
}

}  // namespace tandem::testing

#endif  // TANDEM_COMMON_TESTING_TEST_SERVER_H_
