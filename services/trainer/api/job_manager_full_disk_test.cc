// The trainer's job records on a real full disk: a small tmpfs mounted for the test as its
// data directory (root only, outside Bazel's sandbox: tag "local"; skipped elsewhere).
#include <atomic>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/tmpfs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/trainer/api/job_manager.h"
#include "services/trainer/api/job_spec_testing.h"

namespace tandem::trainer {
namespace {

using ::testing::HasSubstr;

TEST(JobManagerFullDiskTest, AFullTmpfsRefusesNewJobsAndKeepsTheAcknowledgedOnes) {
  std::string why_not;
  std::optional<testing::Tmpfs> disk = testing::Tmpfs::Mount(int64_t{4} << 20, &why_not);
  if (!disk) GTEST_SKIP() << why_not;
  const std::string filler = disk->dir() + "/filler";
  disk->Fill(filler, int64_t{64} << 10);
  // Jobs stay queued behind one that never ends, so nothing but records is written.
  const JobRunner waits = [](const trainer::v1::Job&, const JobProgress&,
                             const std::atomic<bool>& stop) {
    while (!stop) absl::SleepFor(absl::Milliseconds(5));
    return absl::CancelledError("stopped");
  };
  auto jobs = JobManager::Open(disk->dir() + "/trainer", waits);
  ASSERT_TRUE(jobs.ok()) << jobs.status();

  std::vector<std::string> acknowledged;
  absl::Status refused;
  for (int i = 0; i < 2000; ++i) {
    trainer::v1::CreateJobRequest request;
    request.set_request_id(absl::StrCat("r", i));
    *request.mutable_spec() = MinimalValidSpec();
    request.mutable_spec()->set_display_name(std::string(200, 'n'));
    absl::StatusOr<trainer::v1::Job> job = (*jobs)->Create(request);
    if (!job.ok()) {
      refused = job.status();
      break;
    }
    acknowledged.push_back(job->id());
  }
  ASSERT_FALSE(refused.ok()) << "the disk never filled";
  EXPECT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr(disk->dir()));
  EXPECT_FALSE(acknowledged.empty());
  for (const std::string& id : acknowledged) EXPECT_TRUE((*jobs)->Get(id).ok()) << id;

  std::filesystem::remove(filler);  // Space again: jobs are accepted, no restart needed.
  trainer::v1::CreateJobRequest after;
  after.set_request_id("after");
  *after.mutable_spec() = MinimalValidSpec();
  EXPECT_TRUE((*jobs)->Create(after).ok());
  // And what was acknowledged survives a restart.
  jobs->reset();
  auto reopened = JobManager::Open(disk->dir() + "/trainer", waits);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  for (const std::string& id : acknowledged) EXPECT_TRUE((*reopened)->Get(id).ok()) << id;
}

}  // namespace
}  // namespace tandem::trainer
