#include "services/router_replay/route_store.h"

#include <atomic>
#include <filesystem>
#include <memory>
#include <vector>

#include "common/testing/simulated_clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/router_replay/client/testing/route_testing.h"

namespace tandem::router_replay {
namespace {

using ::testing::HasSubstr;

class RouteStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = std::filesystem::path(::testing::TempDir()) /
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(path_);
    Reopen();
  }

  void Reopen() {
    store_.reset();
    absl::StatusOr<std::unique_ptr<RouteStore>> store =
        RouteStore::Open({.path = path_.string(), .clock = &clock_});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }

  static RecordKey Key(absl::string_view sample, int64_t version = 1, int attempt = 0,
                       absl::string_view job = "job-a") {
    return {.job_id = std::string(job),
            .policy_version = version,
            .sample_id = std::string(sample),
            .attempt = attempt};
  }

  absl::StatusOr<AppendOutcome> Append(const RecordKey& key, const std::vector<int16_t>& rows,
                                       int64_t first, int64_t count, bool seal = false) {
    return store_->Append({.key = key,
                           .shape = shape_,
                           .first_row = first,
                           .num_rows = count,
                           .rows = rows.data() + first * shape_.ids_per_row(),
                           .seal = seal});
  }

  std::vector<int16_t> Read(const RecordKey& key, int64_t begin, int64_t end) {
    absl::StatusOr<RecordInfo> record = store_->Get(key);
    EXPECT_TRUE(record.ok()) << record.status();
    std::vector<int16_t> out((end - begin) * shape_.ids_per_row());
    EXPECT_TRUE(store_->ReadRows(*record, begin, end, out.data()).ok());
    return out;
  }

  std::vector<int16_t> Slice(const std::vector<int16_t>& rows, int64_t begin, int64_t end) {
    return {rows.begin() + begin * shape_.ids_per_row(), rows.begin() + end * shape_.ids_per_row()};
  }

  std::filesystem::path path_;
  tandem::testing::SimulatedClock clock_;  // Update times move only when a test advances it.
  std::unique_ptr<RouteStore> store_;
  RouteShape shape_{.layers = {1, 2, 4}, .top_k = 2, .num_experts = 16};
};

// A --data_dir whose parents do not exist yet (a fresh volume path) is created whole.
TEST(RouteStoreOpenTest, CreatesTheDataDirectoryWithItsParents) {
  const std::filesystem::path path =
      std::filesystem::path(::testing::TempDir()) / "fresh-volume" / "not-yet" / "routes";
  std::filesystem::remove_all(path.parent_path().parent_path());
  absl::StatusOr<std::unique_ptr<RouteStore>> store = RouteStore::Open({.path = path.string()});
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE(std::filesystem::is_directory(path));
}

TEST_F(RouteStoreTest, ContinuesARecordFromItsOffsetAndReadsAnyRange) {
  const std::vector<int16_t> rows = SyntheticRoutes(shape_, 100, 1);
  ASSERT_TRUE(Append(Key("s"), rows, 0, 30).ok());
  ASSERT_TRUE(Append(Key("s"), rows, 30, 50).ok());
  absl::StatusOr<AppendOutcome> last = Append(Key("s"), rows, 80, 20, /*seal=*/true);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->rows, 100);
  EXPECT_TRUE(last->sealed);
  EXPECT_EQ(Read(Key("s"), 0, 100), rows);
  EXPECT_EQ(Read(Key("s"), 25, 85), Slice(rows, 25, 85));
  // Past the stored rows comes back -1.
  std::vector<int16_t> beyond = Read(Key("s"), 99, 101);
  EXPECT_EQ(std::vector<int16_t>(beyond.begin(), beyond.begin() + 6), Slice(rows, 99, 100));
  EXPECT_EQ(beyond.back(), -1);
}

// A reader of an unsealed record (a PARTIAL fetch) reads the rows its view of the record
// holds, while a writer appends more: the new block is not mistaken for a corrupt one.
TEST_F(RouteStoreTest, RowsAppendedAfterAReaderLookedAreNotInItsView) {
  const std::vector<int16_t> rows = SyntheticRoutes(shape_, 48, 2);
  ASSERT_TRUE(Append(Key("s"), rows, 0, 40).ok());
  absl::StatusOr<RecordInfo> view = store_->Get(Key("s"));
  ASSERT_TRUE(view.ok()) << view.status();
  ASSERT_TRUE(Append(Key("s"), rows, 40, 8).ok());
  std::vector<int16_t> out(4 * shape_.ids_per_row());
  ASSERT_EQ(store_->ReadRows(*view, 38, 42, out.data()), absl::OkStatus());
  std::vector<int16_t> expected = Slice(rows, 38, 40);
  expected.resize(out.size(), -1);
  EXPECT_EQ(out, expected);
  EXPECT_EQ(Read(Key("s"), 38, 42), Slice(rows, 38, 42));  // A later view has them.
}

// A reader (a fetch) looked a record up, then the TTL sweep removed it before the rows were
// read: NOT_FOUND, never rows of -1 that would pass for the record's own.
TEST_F(RouteStoreTest, RowsOfARecordDeletedAfterAReaderLookedAreNotFound) {
  const std::vector<int16_t> rows = SyntheticRoutes(shape_, 30, 11);
  ASSERT_TRUE(Append(Key("s"), rows, 0, 30, /*seal=*/true).ok());
  absl::StatusOr<RecordInfo> view = store_->Get(Key("s"));
  ASSERT_TRUE(view.ok()) << view.status();
  absl::StatusOr<DeleteOutcome> swept = store_->DeleteUpdatedBefore(absl::InfiniteFuture());
  ASSERT_TRUE(swept.ok()) << swept.status();
  ASSERT_EQ(swept->records, 1);
  std::vector<int16_t> out(10 * shape_.ids_per_row());
  const absl::Status read = store_->ReadRows(*view, 10, 20, out.data());
  EXPECT_EQ(read.code(), absl::StatusCode::kNotFound) << read;
  EXPECT_THAT(read.message(), HasSubstr("job-a/v1/s#0 was deleted while being read"));
  // Rows past those the view holds were never stored: -1 as before, not an error.
  EXPECT_EQ(store_->ReadRows(*view, 30, 31, out.data()), absl::OkStatus());
}

TEST_F(RouteStoreTest, IdenticalRetriesAreNoOpsAndOverlapsOnlyAddTheNewRows) {
  const std::vector<int16_t> rows = SyntheticRoutes(shape_, 40, 2);
  ASSERT_TRUE(Append(Key("s"), rows, 0, 20).ok());
  absl::StatusOr<AppendOutcome> retry = Append(Key("s"), rows, 0, 20);
  ASSERT_TRUE(retry.ok());
  EXPECT_EQ(retry->new_rows, 0);
  EXPECT_EQ(retry->stored_bytes, 0);
  // A multi-turn continuation that re-sends part of the prefix.
  absl::StatusOr<AppendOutcome> overlap = Append(Key("s"), rows, 10, 30);
  ASSERT_TRUE(overlap.ok()) << overlap.status();
  EXPECT_EQ(overlap->new_rows, 20);
  EXPECT_EQ(Read(Key("s"), 0, 40), rows);
}

TEST_F(RouteStoreTest, ConflictingRowsAreAbortedNamingTheFirstDifference) {
  std::vector<int16_t> rows = SyntheticRoutes(shape_, 20, 3);
  ASSERT_TRUE(Append(Key("s"), rows, 0, 20).ok());
  const int64_t index = 12 * shape_.ids_per_row() + 1 * 2 + 1;  // Row 12, layer 2, slot 1.
  const int16_t stored = rows[index];
  rows[index] = static_cast<int16_t>(rows[index - 1] == 15 ? 14 : 15);
  if (rows[index] == stored) rows[index] = 13;
  absl::StatusOr<AppendOutcome> conflict = Append(Key("s"), rows, 5, 15);
  EXPECT_EQ(conflict.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(conflict.status().message().find("differs from stored rows at row 12, layer 2, slot 1"),
            std::string::npos)
      << conflict.status();
}

TEST_F(RouteStoreTest, GapsHeaderChangesAndSealedRecordsAreRefused) {
  const std::vector<int16_t> rows = SyntheticRoutes(shape_, 30, 4);
  ASSERT_TRUE(Append(Key("s"), rows, 0, 10).ok());
  absl::StatusOr<AppendOutcome> gap = Append(Key("s"), rows, 12, 5);
  EXPECT_EQ(gap.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(gap.status().message(), "record job-a/v1/s#0 has 10 rows, chunk starts at 12");
  EXPECT_EQ(Append(Key("new"), rows, 3, 5).status().code(), absl::StatusCode::kFailedPrecondition);

  shape_.num_experts = 32;
  EXPECT_EQ(Append(Key("s"), rows, 10, 5).status().message(),
            "record job-a/v1/s#0: num_experts differs (stored 16, chunk 32)");
  shape_.num_experts = 16;
  shape_.layers = {1, 2, 5};
  EXPECT_EQ(Append(Key("s"), rows, 10, 5).status().message(),
            "record job-a/v1/s#0: layers differ (stored [1,2,4], chunk [1,2,5])");
  shape_.layers = {1, 2, 4};

  ASSERT_TRUE(store_->Seal(Key("s"), 10).ok());
  EXPECT_TRUE(store_->Seal(Key("s"), 10).ok());  // Idempotent.
  EXPECT_EQ(store_->Seal(Key("s"), 11).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Append(Key("s"), rows, 10, 5).status().message(),
            "record job-a/v1/s#0 sealed at 10 rows");
  // Past the sealed end, a gap or different rows do not change the answer.
  EXPECT_EQ(Append(Key("s"), rows, 12, 5).status().message(),
            "record job-a/v1/s#0 sealed at 10 rows");
  EXPECT_EQ(Append(Key("s"), SyntheticRoutes(shape_, 30, 5), 5, 10).status().message(),
            "record job-a/v1/s#0 sealed at 10 rows");
  EXPECT_TRUE(Append(Key("s"), rows, 0, 10).ok());  // A retry of acknowledged rows still works.
  EXPECT_EQ(store_->Seal(Key("absent"), 3).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(Append(Key("t"), rows, 0, 10).ok());
  EXPECT_EQ(store_->Seal(Key("t"), 12).status().message(),
            "record job-a/v1/t#0 has 10 rows, seal says 12");
}

TEST_F(RouteStoreTest, InvalidRowsAreRejectedAndTouchNothing) {
  std::vector<int16_t> rows = SyntheticRoutes(shape_, 10, 5);
  ASSERT_TRUE(Append(Key("good"), rows, 0, 10).ok());
  rows[7 * shape_.ids_per_row() + 5] = rows[7 * shape_.ids_per_row() + 4];  // Row 7 layer 4.
  absl::StatusOr<AppendOutcome> bad = Append(Key("bad"), rows, 0, 10);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("record job-a/v1/bad#0 row 7 layer 4: duplicate expert"),
            std::string::npos)
      << bad.status();
  EXPECT_EQ(store_->Get(Key("bad")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->Get(Key("good"))->rows, 10);
  EXPECT_EQ(Append(Key("bad id!"), rows, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Append(Key("s", -1), rows, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(RouteStoreTest, AttemptsNeverOverwriteEachOther) {
  const std::vector<int16_t> first = SyntheticRoutes(shape_, 10, 6);
  const std::vector<int16_t> second = SyntheticRoutes(shape_, 12, 7);
  ASSERT_TRUE(Append(Key("s", 1, 0), first, 0, 10, true).ok());
  ASSERT_TRUE(Append(Key("s", 1, 1), second, 0, 12, true).ok());
  EXPECT_EQ(Read(Key("s", 1, 0), 0, 10), first);
  EXPECT_EQ(Read(Key("s", 1, 1), 0, 12), second);
}

TEST_F(RouteStoreTest, EverythingAcknowledgedSurvivesReopening) {
  const std::vector<int16_t> rows = SyntheticRoutes(shape_, 50, 8);
  ASSERT_TRUE(Append(Key("s"), rows, 0, 50, true).ok());
  ASSERT_TRUE(Append(Key("open"), rows, 0, 20).ok());
  ASSERT_TRUE(store_->Sync().ok());
  Reopen();
  EXPECT_EQ(Read(Key("s"), 0, 50), rows);
  EXPECT_TRUE(store_->Get(Key("s"))->sealed);
  EXPECT_FALSE(store_->Get(Key("open"))->sealed);
  EXPECT_EQ(store_->totals().sealed_records, 1);
  EXPECT_EQ(store_->totals().open_records, 1);
  EXPECT_GT(store_->totals().stored_bytes, 0);
}

TEST_F(RouteStoreTest, ListsAndDeletesByJobAndVersionRange) {
  const std::vector<int16_t> rows = SyntheticRoutes(shape_, 5, 9);
  for (int version : {1, 2, 3, 10}) {
    for (absl::string_view sample : {"b", "a"})
      ASSERT_TRUE(Append(Key(sample, version), rows, 0, 5).ok());
  }
  ASSERT_TRUE(Append(Key("a", 2, 0, "job-ab"), rows, 0, 5).ok());  // A job whose id extends job-a.
  absl::StatusOr<std::vector<RecordInfo>> listed = store_->ListJob("job-a", 2, 10);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 4u);
  EXPECT_EQ(ToString((*listed)[0].key), "job-a/v2/a#0");
  EXPECT_EQ(ToString((*listed)[3].key), "job-a/v3/b#0");
  EXPECT_EQ(store_->ListJob("job-a", 0, 0)->size(), 8u);

  absl::StatusOr<DeleteOutcome> deleted = store_->DeleteJob("job-a", 2, 4);
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(deleted->records, 4);
  EXPECT_GT(deleted->bytes, 0);
  EXPECT_EQ(store_->ListJob("job-a", 0, 0)->size(), 4u);
  EXPECT_EQ(store_->ListJob("job-ab", 0, 0)->size(), 1u);
  EXPECT_EQ(store_->DeleteJob("job-a", 2, 4)->records, 0);  // Idempotent.
  EXPECT_EQ(store_->totals().open_records, 5);
}

TEST_F(RouteStoreTest, TtlSweepDeletesOnlyRecordsUntouchedSinceTheCutoff) {
  const std::vector<int16_t> rows = SyntheticRoutes(shape_, 5, 10);
  ASSERT_TRUE(Append(Key("old"), rows, 0, 5).ok());
  const absl::Time cutoff = clock_.Now() + absl::Milliseconds(5);
  clock_.Advance(absl::Milliseconds(10));
  ASSERT_TRUE(Append(Key("new"), rows, 0, 5).ok());
  absl::StatusOr<DeleteOutcome> swept = store_->DeleteUpdatedBefore(cutoff);
  ASSERT_TRUE(swept.ok());
  EXPECT_EQ(swept->records, 1);
  EXPECT_EQ(store_->Get(Key("old")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store_->Get(Key("new")).ok());
}

TEST_F(RouteStoreTest, StoresHundredsOfExperts) {
  for (int experts : {256, 384, 600}) {
    shape_ = {.layers = {3, 4, 7, 60}, .top_k = 8, .num_experts = experts};
    const std::vector<int16_t> rows = SyntheticRoutes(shape_, 64, experts, 1.0, 9);
    const RecordKey key = Key(absl::StrCat("e", experts));
    ASSERT_TRUE(Append(key, rows, 0, 64, true).ok());
    EXPECT_EQ(Read(key, 0, 64), rows) << experts;
  }
}

// Local files whose writes fail with "no space" while `full` is set.
class DiskThatFillsUp final : public rocksdb::FileSystemWrapper {
 public:
  DiskThatFillsUp() : FileSystemWrapper(rocksdb::FileSystem::Default()) {}
  const char* Name() const override { return "DiskThatFillsUp"; }

  rocksdb::IOStatus NewWritableFile(const std::string& name, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* file,
                                    rocksdb::IODebugContext* debug) override {
    rocksdb::IOStatus status = target()->NewWritableFile(name, options, file, debug);
    if (status.ok()) *file = std::make_unique<File>(std::move(*file), full);
    return status;
  }

  std::atomic<bool> full{false};

 private:
  class File final : public rocksdb::FSWritableFileOwnerWrapper {
   public:
    File(std::unique_ptr<rocksdb::FSWritableFile> file, std::atomic<bool>& full)
        : FSWritableFileOwnerWrapper(std::move(file)), full_(full) {}
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                             rocksdb::IODebugContext* debug) override {
      if (full_) return rocksdb::IOStatus::NoSpace("the test disk is full");
      return FSWritableFileOwnerWrapper::Append(data, options, debug);
    }
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                             const rocksdb::DataVerificationInfo& info,
                             rocksdb::IODebugContext* debug) override {
      if (full_) return rocksdb::IOStatus::NoSpace("the test disk is full");
      return FSWritableFileOwnerWrapper::Append(data, options, info, debug);
    }

   private:
    std::atomic<bool>& full_;
  };
};

TEST_F(RouteStoreTest, AFullDiskIsResourceExhaustedAndAppendsResumeOnceThereIsSpace) {
  auto disk = std::make_shared<DiskThatFillsUp>();
  store_.reset();
  auto store = RouteStore::Open({.path = path_.string(), .file_system = disk});
  ASSERT_TRUE(store.ok()) << store.status();
  store_ = *std::move(store);
  const std::vector<int16_t> rows = SyntheticRoutes(shape_, 30, 5);
  ASSERT_TRUE(Append(Key("before"), rows, 0, 10).ok());

  disk->full = true;
  const absl::Status full = Append(Key("during"), rows, 0, 10).status();
  EXPECT_TRUE(absl::IsResourceExhausted(full)) << full;
  EXPECT_THAT(full.message(), HasSubstr(path_.string()));

  disk->full = false;  // Space again: the store resumes by itself, no restart needed.
  absl::Status after;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  do {
    after = Append(Key("after"), rows, 0, 10).status();
    if (after.ok()) break;
    EXPECT_TRUE(absl::IsResourceExhausted(after)) << after;
    absl::SleepFor(absl::Milliseconds(20));
  } while (absl::Now() < deadline);
  ASSERT_TRUE(after.ok()) << after;
  EXPECT_EQ(Read(Key("after"), 0, 10), Slice(rows, 0, 10));
  EXPECT_EQ(Read(Key("before"), 0, 10), Slice(rows, 0, 10));
}

}  // namespace
}  // namespace tandem::router_replay
