// Router-replay's store on a real full disk: a small tmpfs mounted for the test (root only,
// outside Bazel's sandbox: tag "local"; skipped elsewhere, saying why).
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/tmpfs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/router_replay/client/testing/route_testing.h"
#include "services/router_replay/route_store.h"

namespace tandem::router_replay {
namespace {

using ::testing::HasSubstr;

TEST(RouteStoreFullDiskTest, AFullTmpfsRefusesAppendsWithoutACrashAndTheyResumeOnceFreed) {
  std::string why_not;
  std::optional<testing::Tmpfs> disk = testing::Tmpfs::Mount(int64_t{24} << 20, &why_not);
  if (!disk) GTEST_SKIP() << why_not;
  const std::string& dir = disk->dir();
  const std::string filler = dir + "/filler";
  disk->Fill(filler, int64_t{3} << 20);  // Leaves the store about 3 MiB.
  auto opened = RouteStore::Open({.path = dir + "/routes"});
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::unique_ptr<RouteStore> store = *std::move(opened);

  const RouteShape shape{.layers = {0, 1, 2, 3, 4, 5, 6, 7}, .top_k = 8, .num_experts = 256};
  const std::vector<int16_t> rows = SyntheticRoutes(shape, 512, 256, 1.0, 3);
  auto append = [&](int sample) {
    return store
        ->Append(
            {.key = {.job_id = "job", .policy_version = 1, .sample_id = absl::StrCat("s", sample)},
             .shape = shape,
             .first_row = 0,
             .num_rows = 512,
             .rows = rows.data(),
             .seal = true})
        .status();
  };
  std::vector<int> acknowledged;
  absl::Status refused;
  for (int sample = 0; sample < 2000; ++sample) {
    refused = append(sample);
    if (!refused.ok()) break;
    acknowledged.push_back(sample);
  }
  ASSERT_FALSE(refused.ok()) << "the disk never filled";
  EXPECT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr(dir));
  EXPECT_FALSE(acknowledged.empty());
  // Refused again, not crashed, while the disk stays full.
  EXPECT_TRUE(absl::IsResourceExhausted(append(100000))) << append(100000);

  // Every acknowledged record reads back whole.
  auto expect_all_there = [&] {
    std::vector<int16_t> out(rows.size());
    for (const int sample : acknowledged) {
      absl::StatusOr<RecordInfo> record = store->Get(
          {.job_id = "job", .policy_version = 1, .sample_id = absl::StrCat("s", sample)});
      ASSERT_TRUE(record.ok()) << sample << ": " << record.status();
      ASSERT_TRUE(store->ReadRows(*record, 0, 512, out.data()).ok()) << sample;
      ASSERT_EQ(out, rows) << sample;
    }
  };
  expect_all_there();

  std::filesystem::remove(filler);  // Space again: appends resume without a restart.
  absl::Status after;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(30); absl::Now() < deadline;) {
    after = append(200000);
    if (after.ok()) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(after.ok()) << after;
  acknowledged.push_back(200000);
  expect_all_there();
}

}  // namespace
}  // namespace tandem::router_replay
