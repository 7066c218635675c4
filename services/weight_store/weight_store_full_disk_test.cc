// The weight-store on a real full disk: a small tmpfs mounted for the test as its data directory
// (root only, outside Bazel's sandbox: tag "local"; skipped elsewhere, saying why). Publishes go
// through gRPC as the trainer's do. A version whose write fails after its announcement is
// withdrawn.
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/test_server.h"
#include "common/testing/tmpfs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/weight_store/client/adapter_client.h"
#include "services/weight_store/client/testing/weight_store_server.h"
#include "services/weight_store/weight_store_service.h"
#include "transfer/lora_testing.h"

namespace tandem::weight_store {
namespace {

using ::testing::HasSubstr;

TEST(WeightStoreFullDiskTest, AFullTmpfsRefusesPublishesAndKeepsCommittedVersions) {
  std::string why_not;
  std::optional<tandem::testing::Tmpfs> disk = tandem::testing::Tmpfs::Mount(int64_t{16} << 20, &why_not);
  if (!disk) GTEST_SKIP() << why_not;
  const std::string filler = disk->dir() + "/filler";
  disk->Fill(filler, int64_t{1} << 20);
  auto server =
      testing::StartWeightStore({.data_dir = disk->dir() + "/store", .enable_ucx = false});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = std::make_unique<WeightStoreStubs>(server->Channel());

  // Adapters of their own names (every version kept) until the disk refuses one.
  std::vector<transfer::TestAdapter> committed;
  absl::Status refused;
  for (int i = 0; i < 500; ++i) {
    transfer::TestAdapter adapter = transfer::MakeTestAdapter(absl::StrCat("job-", i), 1, i);
    refused = PublishAdapter(*stub, adapter.manifest, adapter.shard_views(), {}).status();
    if (!refused.ok()) break;
    committed.push_back(std::move(adapter));
  }
  ASSERT_FALSE(refused.ok()) << "the disk never filled";
  EXPECT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr(disk->dir()));
  EXPECT_FALSE(committed.empty());
  // Refused after its announcement (its shards did not fit) or before: either way not served.
  const std::string refused_name = absl::StrCat("job-", committed.size());
  const absl::Status withdrawn = FetchAdapter(*stub, refused_name, 1, {}).status();
  EXPECT_TRUE(absl::IsNotFound(withdrawn)) << withdrawn;

  auto expect_all_there = [&] {
    for (const transfer::TestAdapter& adapter : committed) {
      const std::string& name = adapter.manifest.adapter_name();
      absl::StatusOr<FetchedAdapter> fetched = FetchAdapter(*stub, name, 1, {});
      ASSERT_TRUE(fetched.ok()) << name << ": " << fetched.status();
    }
  };
  expect_all_there();

  std::filesystem::remove(filler);  // Space again: publishes go on without a restart.
  transfer::TestAdapter after = transfer::MakeTestAdapter("after", 1, 1000);
  const absl::Status published =
      PublishAdapter(*stub, after.manifest, after.shard_views(), {}).status();
  EXPECT_TRUE(published.ok()) << published;
  committed.push_back(std::move(after));
  expect_all_there();
}

}  // namespace
}  // namespace tandem::weight_store
