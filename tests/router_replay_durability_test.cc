// Durability of router-replay as a real process: every append and seal acknowledged before a
// kill -9 is there after a restart on the same data directory, and a stream cut mid-way leaves
// at most a consistent prefix of its record.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/health_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/router_replay/client/route_appender.h"
#include "services/router_replay/client/route_wire.h"
#include "services/router_replay/client/testing/route_testing.h"
#include "tests/service_process.h"

namespace tandem::router_replay {
namespace {

using tandem::testing::PickFreePort;
using tandem::testing::RunfilePath;
using ::testing::HasSubstr;
using tandem::testing::ServiceProcess;

class RouterReplayDurabilityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    data_dir_ = ::testing::TempDir() + "/durability-data";
    std::filesystem::remove_all(data_dir_);
  }

  // Starts the binary on the data directory (with `extra` flags).
  absl::StatusOr<ServiceProcess> Launch(int port, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"--host=127.0.0.1", absl::StrCat("--port=", port),
                                     absl::StrCat("--metrics_port=", PickFreePort()),
                                     "--data_dir=" + data_dir_};
    args.insert(args.end(), extra.begin(), extra.end());
    return ServiceProcess::Start(RunfilePath("services/router_replay/router_replay"), args,
                                 LogPath());
  }

  static std::string LogPath() { return ::testing::TempDir() + "/router_replay.log"; }

  // Starts the binary on the data directory and waits until it serves.
  ServiceProcess Start(const std::vector<std::string>& extra = {}) {
    const int port = PickFreePort();
    auto process = Launch(port, extra);
    EXPECT_TRUE(process.ok()) << process.status();
    channel_ = *CreateChannel({.target = absl::StrCat("127.0.0.1:", port),
                               .service_name = "tandem.routerreplay.v1.RouterReplayService"});
    EXPECT_TRUE(WaitUntilServing({.target = absl::StrCat("127.0.0.1:", port)},
                                 "tandem.routerreplay.v1.RouterReplayService", absl::Seconds(30))
                    .ok());
    return *std::move(process);
  }

  static RecordKey Key(int sample) {
    return {.job_id = "durable", .policy_version = 3, .sample_id = absl::StrCat("s", sample)};
  }

  std::string data_dir_;
  std::shared_ptr<grpc::Channel> channel_;
  const RouteShape shape_{.layers = {1, 2, 5, 9}, .top_k = 4, .num_experts = 64};
};

TEST_F(RouterReplayDurabilityTest, AcknowledgedAppendsAndSealsSurviveKillDashNine) {
  constexpr int kRecords = 120, kRows = 40;
  std::vector<std::vector<int16_t>> routes;
  {
    ServiceProcess process = Start();
    RouteAppender appender(channel_);
    for (int r = 0; r < kRecords; ++r) {
      routes.push_back(SyntheticRoutes(shape_, kRows, r));
      for (int first = 0; first < kRows; first += 10) {
        ASSERT_TRUE(appender
                        .Append(Key(r), shape_, first, 10,
                                routes[r].data() + first * shape_.ids_per_row(),
                                /*seal=*/r % 2 == 0 && first + 10 == kRows)
                        .ok());
      }
    }
    ASSERT_TRUE(appender.Flush(absl::Now() + absl::Seconds(60)).ok());  // All acknowledged.

    // A stream still open when the process dies: nothing of it was acknowledged.
    auto stub = routerreplay::v1::RouterReplayService::NewStub(channel_);
    grpc::ClientContext context;
    routerreplay::v1::AppendResponse response;
    auto writer = stub->Append(&context, &response);
    const std::vector<int16_t> cut = SyntheticRoutes(shape_, 200, 999);
    for (int first = 0; first < 200; first += 20) {
      writer->Write(AppendRequestFor(Key(kRecords), shape_, first, 20,
                                     cut.data() + first * shape_.ids_per_row(), false));
    }
    routes.push_back(cut);
    const int status = process.Stop(SIGKILL);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    context.TryCancel();
  }

  ServiceProcess restarted = Start();
  auto stub = routerreplay::v1::RouterReplayService::NewStub(channel_);
  routerreplay::v1::FetchRoutesRequest request;
  for (int r = 0; r <= kRecords; ++r) {
    *request.mutable_records()->add_records()->mutable_key() = ToProto(Key(r));
  }
  request.set_allow_partial(true);
  grpc::ClientContext context;
  SetTimeout(context, absl::Seconds(30));
  auto reader = stub->FetchRoutes(&context, request);
  routerreplay::v1::FetchRoutesResponse message;
  int records = 0;
  while (reader->Read(&message)) {
    const int r = records++;
    ASSERT_EQ(message.row_offset(), 0);  // Every record fits one message.
    const auto* ids = reinterpret_cast<const int16_t*>(message.rows().data());
    const std::vector<int16_t> got(ids, ids + message.stored_rows() * shape_.ids_per_row());
    if (r == kRecords) {  // The cut stream: absent, or a prefix of what was sent.
      EXPECT_EQ(got, std::vector<int16_t>(routes[r].begin(), routes[r].begin() + got.size()));
      continue;
    }
    EXPECT_EQ(message.stored_rows(), kRows) << r;
    EXPECT_EQ(message.status(), r % 2 == 0 ? routerreplay::v1::RECORD_STATUS_COMPLETE
                                           : routerreplay::v1::RECORD_STATUS_PARTIAL)
        << r;
    EXPECT_EQ(got, routes[r]) << r;
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(records, kRecords + 1);
  EXPECT_EQ(restarted.Stop(SIGTERM), 0);
}

TEST_F(RouterReplayDurabilityTest, ADamagedRouteLogRefusesToStartUnlessTheOperatorChooses) {
  {
    ServiceProcess process = Start();
    RouteAppender appender(channel_);
    for (int r = 0; r < 50; ++r) {
      const std::vector<int16_t> rows = SyntheticRoutes(shape_, 20, r);
      ASSERT_TRUE(appender.Append(Key(r), shape_, 0, 20, rows.data(), /*seal=*/true).ok());
    }
    ASSERT_TRUE(appender.Flush(absl::Now() + absl::Seconds(60)).ok());  // All acknowledged.
    process.Stop(SIGKILL);
  }
  // A disk fault damages the newest log file: its first record, an acknowledged append, is
  // overwritten. (Cutting the file short instead raced RocksDB: it may preallocate past the
  // records, so a cut at half the size could miss them all.)
  std::filesystem::path newest_log;
  for (const auto& entry : std::filesystem::directory_iterator(data_dir_)) {
    if (entry.path().extension() == ".log" &&
        (newest_log.empty() || entry.path().filename() > newest_log.filename())) {
      newest_log = entry.path();
    }
  }
  ASSERT_FALSE(newest_log.empty());
  ASSERT_GT(std::filesystem::file_size(newest_log), 1000u);
  {
    std::fstream file(newest_log, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(16);  // Past the first record's 7-byte header, into its payload.
    const std::string garbage(32, '\xff');
    file.write(garbage.data(), garbage.size());
    ASSERT_TRUE(file.good());
  }

  auto refused = Launch(PickFreePort());
  ASSERT_TRUE(refused.ok()) << refused.status();
  const int status = refused->Wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << status;
  std::ifstream log(LogPath());
  const std::string text((std::istreambuf_iterator<char>(log)), {});
  EXPECT_THAT(text, HasSubstr("is damaged"));
  EXPECT_THAT(text, HasSubstr("--wal_recovery=point_in_time"));

  // The operator's choice: start with what precedes the damage.
  ServiceProcess recovered = Start({"--wal_recovery=point_in_time"});
  EXPECT_EQ(recovered.Stop(SIGTERM), 0);
}

}  // namespace
}  // namespace tandem::router_replay
