#include "common/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <thread>

#include "common/channel.h"
#include "common/health_client.h"
#include "common/testing/test_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using testing::EchoRequest;
using testing::EchoResponse;
using testing::EchoService;

constexpr char kEcho[] = "tandem.testing.EchoService";

grpc::Status Echo(const std::shared_ptr<grpc::Channel>& channel, int delay_ms) {
  grpc::ClientContext context;
  SetTimeout(context, absl::Seconds(20));
  EchoRequest request;
  request.set_delay_ms(delay_ms);
  EchoResponse response;
  return EchoService::NewStub(channel)->Echo(&context, request, &response);
}

TEST(ServiceServerTest, NotServingUntilReady) {
  std::vector<HostedService> services;
  services.push_back({kEcho, std::make_unique<testing::EchoServiceImpl>()});
  ServerOptions options = testing::LoopbackOptions();
  auto server = ServiceServer::Start("echo", std::move(services), options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = *CreateChannel(
      {.target = "127.0.0.1:" + std::to_string((*server)->port()), .service_name = kEcho});
  EXPECT_EQ(*CheckHealth(channel, kEcho, absl::Seconds(5)), Health::kNotServing);
  EXPECT_EQ(*CheckHealth(channel, "", absl::Seconds(5)), Health::kNotServing);
  // Alive while not ready yet: a liveness probe must not restart a server that is loading.
  EXPECT_EQ(*CheckHealth(channel, std::string(kLivenessService), absl::Seconds(5)),
            Health::kServing);
  (*server)->SetReady();
  EXPECT_EQ(*CheckHealth(channel, kEcho, absl::Seconds(5)), Health::kServing);
  EXPECT_EQ(*CheckHealth(channel, "", absl::Seconds(5)), Health::kServing);
  EXPECT_EQ(*CheckHealth(channel, "tandem.trainer.v1.Nope", absl::Seconds(5)),
            Health::kUnknownService);
}

TEST(ServiceServerTest, ReadinessProbeHoldsNotServingUntilItPasses) {
  std::atomic<bool> ready{false};
  std::atomic<int> probes{0};
  std::vector<HostedService> services;
  services.push_back({kEcho, std::make_unique<testing::EchoServiceImpl>(), [&] {
                        ++probes;
                        return ready.load();
                      }});
  auto server = ServiceServer::Start("echo", std::move(services), testing::LoopbackOptions());
  ASSERT_TRUE(server.ok()) << server.status();
  (*server)->SetReady();
  const ChannelOptions target = {.target = "127.0.0.1:" + std::to_string((*server)->port())};
  auto channel = *CreateChannel({.target = target.target, .service_name = kEcho});
  // The probe has been asked (and said no) since SetReady: NOT_SERVING is its answer, not the
  // state every server starts in.
  while (probes.load() < 2) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(*CheckHealth(channel, kEcho, absl::Seconds(5)), Health::kNotServing);
  ready = true;
  EXPECT_TRUE(WaitUntilServing(target, kEcho, absl::Seconds(5)).ok());
}

TEST(ServiceServerTest, DrainFinishesInFlightCallsAndRefusesNewOnes) {
  ServerOptions options = testing::LoopbackOptions();
  options.drain_delay = absl::Milliseconds(500);
  auto server = testing::StartEchoServer(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = *CreateChannel({.target = server->target(), .service_name = kEcho});

  auto in_flight = std::async(std::launch::async, [&] { return Echo(channel, 1500); });
  while (server->echo->calls_started.load() == 0) absl::SleepFor(absl::Milliseconds(5));
  std::thread drain([&] { server->server->Drain(); });

  // During the drain delay health already says NOT_SERVING, so balancers move away first;
  // liveness still passes, so the drain is not cut short by a restart.
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(*CheckHealth(channel, kEcho, absl::Seconds(5)), Health::kNotServing);
  EXPECT_EQ(*CheckHealth(channel, std::string(kLivenessService), absl::Seconds(5)),
            Health::kServing);
  // After it, new calls are refused while the old one is still running.
  absl::SleepFor(absl::Milliseconds(600));
  const grpc::Status refused = Echo(channel, 0);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();

  const grpc::Status finished = in_flight.get();
  EXPECT_TRUE(finished.ok()) << finished.error_message();
  drain.join();
}

TEST(ServiceServerTest, DrainCancelsCallsThatOutliveTheTimeout) {
  ServerOptions options = testing::LoopbackOptions();
  options.drain_timeout = absl::Milliseconds(200);
  auto server = testing::StartEchoServer(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = *CreateChannel({.target = server->target(), .service_name = kEcho});
  auto in_flight = std::async(std::launch::async, [&] { return Echo(channel, 3000); });
  while (server->echo->calls_started.load() == 0) absl::SleepFor(absl::Milliseconds(5));
  const absl::Time start = absl::Now();
  server->server->Drain();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  // The server cancels the call and closes the connection; the client sees either.
  EXPECT_THAT(in_flight.get().error_code(),
              ::testing::AnyOf(grpc::StatusCode::CANCELLED, grpc::StatusCode::UNAVAILABLE));
}

// A connection with nothing in flight does not hold a drain up: not a client that answers the
// GOAWAY's ping late, nor one that never speaks HTTP/2 at all (gRPC waits 20 s for it).
TEST(ServiceServerTest, DrainWithNothingInFlightDoesNotWaitForIdleConnections) {
  auto server = testing::StartEchoServer(testing::LoopbackOptions());
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = *CreateChannel({.target = server->target(), .service_name = kEcho});
  ASSERT_TRUE(Echo(channel, 0).ok());  // Connected, and idle from now on.
  const int silent = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{.sin_family = AF_INET, .sin_port = htons(server->server->port())};
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(silent, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  absl::SleepFor(absl::Milliseconds(100));  // Accepted by the server.
  const absl::Time start = absl::Now();
  server->server->Drain();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  close(silent);
}

TEST(ServiceServerTest, BusyPortIsUnavailable) {
  auto first = testing::StartEchoServer(testing::LoopbackOptions());
  ASSERT_TRUE(first.ok()) << first.status();
  ServerOptions options = testing::LoopbackOptions();
  options.port = first->server->port();
  auto second = testing::StartEchoServer(options);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tandem
