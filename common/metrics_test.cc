#include "common/metrics.h"

#include <pthread.h>

#include <string>

#include "common/channel.h"
#include "common/testing/http_get.h"
#include "common/testing/test_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

// The value of one series in a scraped page, 0 when absent. Metrics are per process and other
// tests in this binary make calls too, so tests compare values before and after.
double SeriesValue(const std::string& page, const std::string& series) {
  const size_t at = page.find("\n" + series + " ");
  if (at == std::string::npos) return 0;
  return std::stod(page.substr(at + series.size() + 2));
}

std::string Scrape(const testing::EchoServer& server) {
  auto page = testing::HttpGet("http://127.0.0.1:" + std::to_string(server.server->metrics_port()) +
                               "/metrics");
  EXPECT_TRUE(page.ok()) << page.status();
  return page.value_or("");
}

// civetweb asks for 100 KiB stacks, which the /metrics handler nearly fills; the floor in
// metrics.cc raises every requested size to at least 1 MiB.
TEST(MetricsTest, ThreadsAskingForSmallStacksGetTheFloor) {
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, 102400), 0);
  size_t granted = 0;
  ASSERT_EQ(pthread_attr_getstacksize(&attr, &granted), 0);
  EXPECT_EQ(granted, size_t{1} << 20);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, size_t{8} << 20), 0);  // Larger sizes stand.
  ASSERT_EQ(pthread_attr_getstacksize(&attr, &granted), 0);
  EXPECT_EQ(granted, size_t{8} << 20);
  pthread_attr_destroy(&attr);
}

TEST(MetricsTest, ScrapeShowsTheRpcHistogramAfterACall) {
  auto server = testing::StartEchoServer(testing::LoopbackOptions());
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string kLabels =
      "{code=\"OK\",method=\"Echo\",service=\"tandem.testing.EchoService\"}";
  const std::string kCount = "tandem_rpc_server_handling_seconds_count" + kLabels;
  const std::string kHandled = "tandem_rpc_server_handled_total" + kLabels;
  const std::string before = Scrape(*server);

  auto channel =
      *CreateChannel({.target = server->target(), .service_name = "tandem.testing.EchoService"});
  grpc::ClientContext context;
  SetTimeout(context, absl::Seconds(10));
  testing::EchoRequest request;
  testing::EchoResponse response;
  ASSERT_TRUE(testing::EchoService::NewStub(channel)->Echo(&context, request, &response).ok());

  const std::string page = Scrape(*server);
  EXPECT_THAT(page, HasSubstr("# TYPE tandem_rpc_server_handling_seconds histogram"));
  EXPECT_EQ(SeriesValue(page, kCount) - SeriesValue(before, kCount), 1);
  EXPECT_EQ(SeriesValue(page, kHandled) - SeriesValue(before, kHandled), 1);
  EXPECT_THAT(page, HasSubstr("tandem_rpc_server_handling_seconds_bucket{code=\"OK\",method="
                              "\"Echo\",service=\"tandem.testing.EchoService\",le=\"0.001\"}"));
  EXPECT_THAT(page, HasSubstr("tandem_build_info{service=\"echo\",version=\""));
}

TEST(MetricsTest, ErrorsAreLabelledWithTheirCode) {
  auto server = testing::StartEchoServer(testing::LoopbackOptions());
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel =
      *CreateChannel({.target = server->target(), .service_name = "tandem.testing.EchoService"});
  grpc::ClientContext context;
  SetTimeout(context, absl::Seconds(10));
  testing::EchoRequest request;
  request.set_fail_attempts(1);
  testing::EchoResponse response;
  testing::EchoService::NewStub(channel)->Append(&context, request, &response);

  EXPECT_THAT(Scrape(*server),
              HasSubstr("tandem_rpc_server_handled_total{code=\"UNAVAILABLE\",method="
                        "\"Append\",service=\"tandem.testing.EchoService\"}"));
}

TEST(MetricsTest, OneEndpointPerProcess) {
  auto first = ServeMetrics("127.0.0.1", 0);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*ServeMetrics("127.0.0.1", 0), *first);
  EXPECT_EQ(*ServeMetrics("127.0.0.1", *first), *first);
  EXPECT_EQ(ServeMetrics("127.0.0.1", *first + 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ServeMetrics("0.0.0.0", *first).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tandem
