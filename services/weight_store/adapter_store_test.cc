// The weight-store's core in process, without gRPC or UCX (bytes arrive by Put): commit and its
// checks, version rules, abort, watch, restart recovery, retention with leases, and expiry of
// uploads and leases.
#include "services/weight_store/adapter_store.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/testing/simulated_clock.h"
#include "common/testing/test_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transfer/lora_testing.h"

namespace tandem::weight_store {
namespace {

namespace fs = std::filesystem;

using ::testing::HasSubstr;

uint64_t TotalBytes(const transfer::TestAdapter& adapter) {
  uint64_t total = 0;
  for (const std::string& shard : adapter.shards) total += shard.size();
  return total;
}

class AdapterStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    data_dir_ = (fs::path(::testing::TempDir()) /
                 absl::StrCat("adapter_store_",
                              ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                    .string();
    fs::remove_all(data_dir_);
    Reopen();
  }

  void TearDown() override {
    store_.reset();
    fs::remove_all(data_dir_);
  }

  // (Re)opens the store on data_dir_, as a restarted service does.
  void Reopen(int keep_versions = 3, absl::Duration upload_expiry = absl::Minutes(1)) {
    store_.reset();
    absl::StatusOr<std::unique_ptr<AdapterStore>> store =
        AdapterStore::Open({.data_dir = data_dir_,
                            .keep_versions = keep_versions,
                            .upload_expiry = upload_expiry,
                            .clock = &clock_});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }

  // Puts every shard of `adapter` whole.
  absl::Status PutAll(const std::string& upload_id, const transfer::TestAdapter& adapter) {
    for (size_t i = 0; i < adapter.shards.size(); ++i) {
      absl::StatusOr<uint64_t> written =
          store_->Put(upload_id, static_cast<int>(i), 0, adapter.shards[i]);
      if (!written.ok()) return written.status();
    }
    return absl::OkStatus();
  }

  absl::StatusOr<AdapterStore::CommitOutcome> Publish(const transfer::TestAdapter& adapter) {
    absl::StatusOr<BeginResult> begun = store_->Begin(adapter.manifest, /*use_ucx=*/false);
    if (!begun.ok()) return begun.status();
    if (absl::Status status = PutAll(begun->upload_id, adapter); !status.ok()) return status;
    return store_->Commit(begun->upload_id);
  }

  // Where a version lives on disk; `dir_name` is the adapter name percent-encoded.
  std::string VersionDir(const std::string& dir_name, int64_t version) const {
    return (fs::path(data_dir_) / dir_name / absl::StrCat(version)).string();
  }

  static void ExpectHolds(const CommittedVersion& version, const transfer::TestAdapter& adapter) {
    EXPECT_EQ(version.manifest.adapter_name(), adapter.manifest.adapter_name());
    EXPECT_EQ(version.manifest.version(), adapter.manifest.version());
    EXPECT_EQ(version.manifest.total_bytes(), TotalBytes(adapter));
    EXPECT_TRUE(version.manifest.has_commit_time());
    ASSERT_EQ(version.shards.size(), adapter.shards.size());
    for (size_t i = 0; i < adapter.shards.size(); ++i) {
      EXPECT_TRUE(version.shards[i]->bytes() == adapter.shards[i]) << "shard " << i;
    }
  }

  void ExpectNotFound(const std::string& adapter, int64_t version) const {
    absl::StatusOr<std::shared_ptr<const CommittedVersion>> found =
        store_->Find(adapter, version, 0);
    EXPECT_TRUE(absl::IsNotFound(found.status()))
        << adapter << "@" << version << ": " << found.status();
    EXPECT_THAT(found.status().message(),
                HasSubstr(absl::StrCat("equal to ", version, " (never committed, or retired)")));
  }

  std::string data_dir_;
  tandem::testing::SimulatedClock clock_;  // Expiry moves only when a test advances it.
  std::unique_ptr<AdapterStore> store_;
};

TEST_F(AdapterStoreTest, CommitPublishesTheVersionWithItsBytes) {
  const transfer::TestAdapter adapter = transfer::MakeTestAdapter("job-1", 1, 1);
  ASSERT_GE(adapter.shards.size(), 2u);
  const absl::Time before = clock_.Now();
  absl::StatusOr<BeginResult> begun = store_->Begin(adapter.manifest, /*use_ucx=*/false);
  ASSERT_TRUE(begun.ok()) << begun.status();
  EXPECT_GE(begun->expire_time, before + absl::Minutes(1));
  ASSERT_EQ(begun->shards.size(), adapter.shards.size());
  for (size_t i = 0; i < adapter.shards.size(); ++i) {
    EXPECT_EQ(begun->shards[i]->length(), adapter.shards[i].size());
    EXPECT_EQ(begun->shards[i]->region(), nullptr);  // Plain memory without UCX.
  }
  EXPECT_EQ(store_->totals().open_uploads, 1);

  // Put counts distinct bytes: a rewritten or overlapping chunk counts once.
  const std::string& shard0 = adapter.shards[0];
  const size_t half = shard0.size() / 2;
  EXPECT_EQ(*store_->Put(begun->upload_id, 0, 0, shard0.substr(0, half)), half);
  EXPECT_EQ(*store_->Put(begun->upload_id, 0, 0, shard0.substr(0, half)), half);
  EXPECT_EQ(*store_->Put(begun->upload_id, 0, half / 2, shard0.substr(half / 2)), shard0.size());
  for (size_t i = 1; i < adapter.shards.size(); ++i) {
    EXPECT_EQ(*store_->Put(begun->upload_id, static_cast<int>(i), 0, adapter.shards[i]),
              adapter.shards[i].size());
  }
  // Invisible until committed.
  ExpectNotFound("job-1", 1);
  EXPECT_EQ(store_->Newest("job-1").version(), 0);

  absl::StatusOr<AdapterStore::CommitOutcome> committed = store_->Commit(begun->upload_id);
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_FALSE(committed->repeated);
  EXPECT_FALSE(committed->by_ucx);
  EXPECT_GE(committed->since_begin, absl::ZeroDuration());
  EXPECT_EQ(committed->version.adapter_name(), "job-1");
  EXPECT_EQ(committed->version.version(), 1);
  EXPECT_EQ(committed->version.total_bytes(), TotalBytes(adapter));
  EXPECT_TRUE(committed->version.has_commit_time());

  absl::StatusOr<std::shared_ptr<const CommittedVersion>> exact = store_->Find("job-1", 1, 0);
  ASSERT_TRUE(exact.ok()) << exact.status();
  ExpectHolds(**exact, adapter);
  EXPECT_EQ((*exact)->Info().DebugString(), committed->version.DebugString());
  EXPECT_EQ(store_->Newest("job-1").DebugString(), committed->version.DebugString());
  absl::StatusOr<std::shared_ptr<const CommittedVersion>> newest = store_->Find("job-1", 0, 0);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->get(), exact->get());
  absl::StatusOr<std::shared_ptr<const CommittedVersion>> at_least_1 = store_->Find("job-1", 0, 1);
  ASSERT_TRUE(at_least_1.ok()) << at_least_1.status();
  EXPECT_EQ(at_least_1->get(), exact->get());
  absl::Status too_new = store_->Find("job-1", 0, 2).status();
  EXPECT_TRUE(absl::IsNotFound(too_new)) << too_new;
  EXPECT_THAT(too_new.message(), HasSubstr("adapter 'job-1' >= 2"));
  ExpectNotFound("job-1", 2);
  ExpectNotFound("job-2", 1);
  const weightstore::v1::VersionInfo none = store_->Newest("job-2");
  EXPECT_EQ(none.adapter_name(), "job-2");
  EXPECT_EQ(none.version(), 0);
  EXPECT_FALSE(none.has_commit_time());

  const AdapterStore::Totals totals = store_->totals();
  EXPECT_EQ(totals.versions, 1);
  EXPECT_EQ(totals.bytes, static_cast<int64_t>(TotalBytes(adapter)));
  EXPECT_EQ(totals.open_uploads, 0);
  EXPECT_EQ(totals.leases, 0);
  EXPECT_TRUE(fs::exists(fs::path(VersionDir("job-1", 1)) / "manifest.binpb"));
  EXPECT_FALSE(fs::exists(VersionDir("job-1", 1) + ".partial"));
}

// Retiring a version hands its memory to the next uploads of the same shard sizes, once no reader
// holds the retired version any more.
TEST_F(AdapterStoreTest, NewUploadsReuseTheMemoryOfRetiredVersions) {
  Reopen(/*keep_versions=*/1);
  // Publishes version `v`, returning the addresses its shards were put into.
  const auto publish = [&](int64_t v) {
    const transfer::TestAdapter adapter = transfer::MakeTestAdapter("job-1", v, v);
    absl::StatusOr<BeginResult> begun = store_->Begin(adapter.manifest, false);
    EXPECT_TRUE(begun.ok()) << begun.status();
    std::set<uintptr_t> memory;
    for (const ShardBuffer* shard : begun->shards) {
      memory.insert(reinterpret_cast<uintptr_t>(shard->data()));
    }
    EXPECT_TRUE(PutAll(begun->upload_id, adapter).ok());
    EXPECT_TRUE(store_->Commit(begun->upload_id).ok());
    ExpectHolds(**store_->Find("job-1", v, 0), adapter);
    return memory;
  };
  const std::set<uintptr_t> first = publish(1);
  auto reader = store_->Find("job-1", 1, 0);  // A fetch of version 1 in flight.
  ASSERT_TRUE(reader.ok());
  const std::set<uintptr_t> second = publish(2);  // Retires version 1, which is still read.
  const std::set<uintptr_t> third = publish(3);   // Retires version 2.
  for (uintptr_t memory : third) EXPECT_FALSE(first.contains(memory)) << "version 1 is read";
  EXPECT_EQ(publish(4), second) << "version 4 takes version 2's memory";
  ExpectHolds(**reader, transfer::MakeTestAdapter("job-1", 1, 1));
  reader->reset();  // Now version 1's memory returns to the pool, after version 3's.
  EXPECT_EQ(publish(5), third);
  EXPECT_EQ(publish(6), first);
}

TEST_F(AdapterStoreTest, CommitWithMissingBytesFailsAndLeavesTheUploadOpen) {
  const transfer::TestAdapter adapter = transfer::MakeTestAdapter("job-1", 1, 2);
  absl::StatusOr<BeginResult> begun = store_->Begin(adapter.manifest, false);
  ASSERT_TRUE(begun.ok()) << begun.status();
  const std::string& shard0 = adapter.shards[0];
  const size_t half = shard0.size() / 2;
  ASSERT_TRUE(store_->Put(begun->upload_id, 0, 0, shard0.substr(0, half)).ok());
  for (size_t i = 1; i < adapter.shards.size(); ++i) {
    ASSERT_TRUE(store_->Put(begun->upload_id, static_cast<int>(i), 0, adapter.shards[i]).ok());
  }

  absl::Status missing = store_->Commit(begun->upload_id).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(missing)) << missing;
  EXPECT_THAT(missing.message(),
              HasSubstr(absl::StrCat("shard 0: ", half, " of ", shard0.size(), " bytes written")));
  ExpectNotFound("job-1", 1);
  EXPECT_EQ(store_->totals().open_uploads, 1);
  EXPECT_FALSE(fs::exists(VersionDir("job-1", 1)));

  ASSERT_TRUE(store_->Put(begun->upload_id, 0, half, shard0.substr(half)).ok());
  absl::StatusOr<AdapterStore::CommitOutcome> committed = store_->Commit(begun->upload_id);
  ASSERT_TRUE(committed.ok()) << committed.status();
  absl::StatusOr<std::shared_ptr<const CommittedVersion>> found = store_->Find("job-1", 1, 0);
  ASSERT_TRUE(found.ok()) << found.status();
  ExpectHolds(**found, adapter);
}

TEST_F(AdapterStoreTest, CommitWithAWrongChecksumFailsAndARePutFixesIt) {
  const transfer::TestAdapter adapter = transfer::MakeTestAdapter("job-1", 1, 3);
  ASSERT_GE(adapter.shards.size(), 2u);
  absl::StatusOr<BeginResult> begun = store_->Begin(adapter.manifest, false);
  ASSERT_TRUE(begun.ok()) << begun.status();
  ASSERT_TRUE(PutAll(begun->upload_id, adapter).ok());
  std::string corrupt = adapter.shards[1];
  corrupt[corrupt.size() / 2] ^= 1;
  ASSERT_TRUE(store_->Put(begun->upload_id, 1, 0, corrupt).ok());

  absl::Status mismatch = store_->Commit(begun->upload_id).status();
  EXPECT_TRUE(absl::IsAborted(mismatch)) << mismatch;
  EXPECT_THAT(mismatch.message(), HasSubstr("shard 1: xxh3 0x"));
  ExpectNotFound("job-1", 1);
  EXPECT_FALSE(fs::exists(VersionDir("job-1", 1)));
  EXPECT_FALSE(fs::exists(VersionDir("job-1", 1) + ".partial"));
  EXPECT_FALSE(fs::exists(VersionDir("job-1", 1) + ".announced"))
      << "the record written beside the check is removed when the check fails";

  ASSERT_TRUE(store_->Put(begun->upload_id, 1, 0, adapter.shards[1]).ok());
  absl::StatusOr<AdapterStore::CommitOutcome> committed = store_->Commit(begun->upload_id);
  ASSERT_TRUE(committed.ok()) << committed.status();
  absl::StatusOr<std::shared_ptr<const CommittedVersion>> found = store_->Find("job-1", 1, 0);
  ASSERT_TRUE(found.ok()) << found.status();
  ExpectHolds(**found, adapter);
}

TEST_F(AdapterStoreTest, CommitIsIdempotentAndClosesTheUpload) {
  const transfer::TestAdapter adapter = transfer::MakeTestAdapter("job-1", 1, 4);
  absl::StatusOr<BeginResult> begun = store_->Begin(adapter.manifest, false);
  ASSERT_TRUE(begun.ok()) << begun.status();
  ASSERT_TRUE(PutAll(begun->upload_id, adapter).ok());
  absl::StatusOr<AdapterStore::CommitOutcome> first = store_->Commit(begun->upload_id);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->repeated);

  absl::StatusOr<AdapterStore::CommitOutcome> again = store_->Commit(begun->upload_id);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->repeated);
  EXPECT_EQ(again->version.DebugString(), first->version.DebugString());
  EXPECT_EQ(store_->totals().versions, 1);

  absl::Status put = store_->Put(begun->upload_id, 0, 0, "x").status();
  EXPECT_TRUE(absl::IsFailedPrecondition(put)) << put;
  EXPECT_THAT(put.message(), HasSubstr("is committed"));
  absl::Status abort = store_->Abort(begun->upload_id);
  EXPECT_TRUE(absl::IsFailedPrecondition(abort)) << abort;
  EXPECT_TRUE(store_->Find("job-1", 1, 0).ok());

  absl::Status unknown = store_->Commit("upload-unknown").status();
  EXPECT_TRUE(absl::IsNotFound(unknown)) << unknown;
  EXPECT_THAT(unknown.message(), HasSubstr("upload upload-unknown not found"));
}

TEST_F(AdapterStoreTest, PutRejectsWritesOutsideTheShards) {
  const transfer::TestAdapter adapter = transfer::MakeTestAdapter("job-1", 1, 5);
  absl::StatusOr<BeginResult> begun = store_->Begin(adapter.manifest, false);
  ASSERT_TRUE(begun.ok()) << begun.status();
  const int shards = static_cast<int>(adapter.shards.size());
  const uint64_t size = adapter.shards[0].size();

  for (int index : {-1, shards}) {
    absl::Status status = store_->Put(begun->upload_id, index, 0, "a").status();
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
    EXPECT_THAT(status.message(),
                HasSubstr(absl::StrCat("shard_index ", index, " out of range [0, ", shards, ")")));
  }
  absl::Status past_end = store_->Put(begun->upload_id, 0, size - 1, "ab").status();
  EXPECT_TRUE(absl::IsInvalidArgument(past_end)) << past_end;
  EXPECT_THAT(past_end.message(), HasSubstr(absl::StrCat("shard 0: 2 bytes at offset ", size - 1,
                                                         " do not fit its ", size, " bytes")));
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Put(begun->upload_id, 0, size + 1, "a").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Put(begun->upload_id, 0, 0, "").status()));
  absl::Status unknown = store_->Put("upload-unknown", 0, 0, "a").status();
  EXPECT_TRUE(absl::IsNotFound(unknown)) << unknown;
  EXPECT_THAT(unknown.message(), HasSubstr("not found (or expired)"));
  // Nothing was written by the refused puts.
  absl::StatusOr<uint64_t> written = store_->Put(begun->upload_id, 0, size - 1, "a");
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(*written, 1u);
}

TEST_F(AdapterStoreTest, BeginValidatesTheManifestAndNeedsUcxForUcxUploads) {
  weightstore::v1::Manifest broken = transfer::MakeTestAdapter("job-1", 1, 6).manifest;
  broken.mutable_shards(0)->mutable_pieces()->RemoveLast();
  absl::Status invalid = store_->Begin(broken, false).status();
  EXPECT_TRUE(absl::IsInvalidArgument(invalid)) << invalid;
  EXPECT_THAT(invalid.message(), HasSubstr("job-1@1: "));

  absl::Status no_ucx =
      store_->Begin(transfer::MakeTestAdapter("job-1", 1, 6).manifest, true).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(no_ucx)) << no_ucx;
  EXPECT_THAT(no_ucx.message(), HasSubstr("runs without UCX"));
  EXPECT_EQ(store_->totals().open_uploads, 0);
}

TEST_F(AdapterStoreTest, VersionRules) {
  const transfer::TestAdapter v2 = transfer::MakeTestAdapter("job-1", 2, 7);
  absl::StatusOr<BeginResult> first = store_->Begin(v2.manifest, false);
  ASSERT_TRUE(first.ok()) << first.status();
  // A retried Begin gets the same upload and targets.
  absl::StatusOr<BeginResult> retried = store_->Begin(v2.manifest, false);
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_EQ(retried->upload_id, first->upload_id);
  EXPECT_EQ(retried->shards, first->shards);
  EXPECT_EQ(store_->totals().open_uploads, 1);
  // Another manifest for the version being uploaded is refused.
  const transfer::TestAdapter rival = transfer::MakeTestAdapter("job-1", 2, 8);
  absl::Status concurrent = store_->Begin(rival.manifest, false).status();
  EXPECT_TRUE(absl::IsAborted(concurrent)) << concurrent;
  EXPECT_THAT(concurrent.message(),
              HasSubstr(absl::StrCat("upload ", first->upload_id, " for job-1@2 in progress")));

  ASSERT_TRUE(PutAll(first->upload_id, v2).ok());
  ASSERT_TRUE(store_->Commit(first->upload_id).ok());
  absl::Status equal = store_->Begin(rival.manifest, false).status();
  EXPECT_TRUE(absl::IsAlreadyExists(equal)) << equal;
  EXPECT_THAT(equal.message(), HasSubstr("job-1@2 is already committed"));
  absl::Status older =
      store_->Begin(transfer::MakeTestAdapter("job-1", 1, 9).manifest, false).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(older)) << older;
  EXPECT_THAT(older.message(), HasSubstr("version 1 < newest 2 of job-1"));
  // Versions of other adapters are independent.
  EXPECT_TRUE(Publish(transfer::MakeTestAdapter("job-2", 1, 10)).ok());
  absl::StatusOr<AdapterStore::CommitOutcome> v3 =
      Publish(transfer::MakeTestAdapter("job-1", 3, 11));
  ASSERT_TRUE(v3.ok()) << v3.status();
  EXPECT_EQ(store_->Newest("job-1").version(), 3);
}

TEST_F(AdapterStoreTest, ACommitOvertakenByANewerVersionFails) {
  const transfer::TestAdapter v5 = transfer::MakeTestAdapter("job-1", 5, 12);
  const transfer::TestAdapter v6 = transfer::MakeTestAdapter("job-1", 6, 13);
  absl::StatusOr<BeginResult> begun5 = store_->Begin(v5.manifest, false);
  absl::StatusOr<BeginResult> begun6 = store_->Begin(v6.manifest, false);
  ASSERT_TRUE(begun5.ok()) << begun5.status();
  ASSERT_TRUE(begun6.ok()) << begun6.status();
  ASSERT_TRUE(PutAll(begun5->upload_id, v5).ok());
  ASSERT_TRUE(PutAll(begun6->upload_id, v6).ok());
  ASSERT_TRUE(store_->Commit(begun6->upload_id).ok());

  absl::Status overtaken = store_->Commit(begun5->upload_id).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(overtaken)) << overtaken;
  EXPECT_THAT(overtaken.message(), HasSubstr("version 5 <= newest 6 of job-1 committed meanwhile"));
  ExpectNotFound("job-1", 5);
  EXPECT_EQ(store_->Newest("job-1").version(), 6);
  EXPECT_EQ(store_->totals().versions, 1);
  EXPECT_FALSE(fs::exists(VersionDir("job-1", 5)));
  EXPECT_FALSE(fs::exists(VersionDir("job-1", 5) + ".partial"));
  EXPECT_TRUE(fs::exists(VersionDir("job-1", 6)));
  // The overtaken upload gave its bytes up: it is closed, not left open and retryable.
  EXPECT_EQ(store_->totals().open_uploads, 0);
  absl::Status put = store_->Put(begun5->upload_id, 0, 0, v5.shards[0]).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(put)) << put;
  absl::Status retried = store_->Commit(begun5->upload_id).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(retried)) << retried;
  EXPECT_THAT(retried.message(), HasSubstr("aborted"));
}

TEST_F(AdapterStoreTest, AbortFreesTheUpload) {
  const transfer::TestAdapter adapter = transfer::MakeTestAdapter("job-1", 1, 14);
  absl::StatusOr<BeginResult> begun = store_->Begin(adapter.manifest, false);
  ASSERT_TRUE(begun.ok()) << begun.status();
  EXPECT_TRUE(store_->HasOpenUpload("job-1"));
  EXPECT_FALSE(store_->HasOpenUpload("job-2"));
  ASSERT_TRUE(PutAll(begun->upload_id, adapter).ok());
  ASSERT_TRUE(store_->Abort(begun->upload_id).ok());
  EXPECT_EQ(store_->totals().open_uploads, 0);
  EXPECT_FALSE(store_->HasOpenUpload("job-1"));

  absl::Status put = store_->Put(begun->upload_id, 0, 0, "x").status();
  EXPECT_TRUE(absl::IsFailedPrecondition(put)) << put;
  EXPECT_THAT(put.message(), HasSubstr("is aborted"));
  absl::Status commit = store_->Commit(begun->upload_id).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(commit)) << commit;
  EXPECT_THAT(commit.message(), HasSubstr("is aborted"));
  ExpectNotFound("job-1", 1);
  EXPECT_TRUE(store_->Abort(begun->upload_id).ok());  // Idempotent,
  EXPECT_TRUE(store_->Abort("upload-unknown").ok());  // also for unknown ids.

  // The version can be published again, by a new upload.
  absl::StatusOr<BeginResult> again = store_->Begin(adapter.manifest, false);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NE(again->upload_id, begun->upload_id);
  ASSERT_TRUE(PutAll(again->upload_id, adapter).ok());
  ASSERT_TRUE(store_->Commit(again->upload_id).ok());
  absl::StatusOr<std::shared_ptr<const CommittedVersion>> found = store_->Find("job-1", 1, 0);
  ASSERT_TRUE(found.ok()) << found.status();
  ExpectHolds(**found, adapter);
}

TEST_F(AdapterStoreTest, WatchersHearEachCommitOfTheirAdapterOnceItIsVisible) {
  std::vector<weightstore::v1::VersionInfo> heard;
  std::vector<bool> visible;
  const int64_t watch = store_->Watch("job-1", [&](const weightstore::v1::VersionInfo& info) {
    heard.push_back(info);
    // Called without store locks held, after the version is visible.
    visible.push_back(store_->Find(info.adapter_name(), info.version(), 0).ok());
  });
  int other_adapter = 0;
  store_->Watch("job-2", [&](const weightstore::v1::VersionInfo&) { ++other_adapter; });

  const transfer::TestAdapter adapter = transfer::MakeTestAdapter("job-1", 1, 15);
  absl::StatusOr<BeginResult> begun = store_->Begin(adapter.manifest, false);
  ASSERT_TRUE(begun.ok()) << begun.status();
  ASSERT_TRUE(PutAll(begun->upload_id, adapter).ok());
  absl::StatusOr<AdapterStore::CommitOutcome> first = store_->Commit(begun->upload_id);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(store_->Commit(begun->upload_id).ok());  // A repeated commit is not announced.
  absl::StatusOr<AdapterStore::CommitOutcome> second =
      Publish(transfer::MakeTestAdapter("job-1", 2, 16));
  ASSERT_TRUE(second.ok()) << second.status();

  ASSERT_EQ(heard.size(), 2u);
  EXPECT_EQ(heard[0].DebugString(), first->version.DebugString());
  EXPECT_EQ(heard[1].DebugString(), second->version.DebugString());
  EXPECT_EQ(visible, std::vector<bool>({true, true}));
  EXPECT_EQ(other_adapter, 0);

  store_->Unwatch(watch);
  ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-1", 3, 17)).ok());
  EXPECT_EQ(heard.size(), 2u);
  ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-2", 1, 18)).ok());
  EXPECT_EQ(other_adapter, 1);
}

TEST_F(AdapterStoreTest, CommittedVersionsSurviveReopeningAndOpenUploadsDoNot) {
  const transfer::TestAdapter v1_adapter = transfer::MakeTestAdapter("team/job:1", 1, 19);
  const transfer::TestAdapter v2 = transfer::MakeTestAdapter("team/job:1", 2, 20);
  const transfer::TestAdapter other = transfer::MakeTestAdapter("job-2", 1, 21);
  ASSERT_TRUE(Publish(v1_adapter).ok());
  absl::StatusOr<AdapterStore::CommitOutcome> committed2 = Publish(v2);
  ASSERT_TRUE(committed2.ok()) << committed2.status();
  ASSERT_TRUE(Publish(other).ok());
  // Every byte of version 3 is put, but it is never committed.
  const transfer::TestAdapter v3 = transfer::MakeTestAdapter("team/job:1", 3, 22);
  absl::StatusOr<BeginResult> begun3 = store_->Begin(v3.manifest, false);
  ASSERT_TRUE(begun3.ok()) << begun3.status();
  ASSERT_TRUE(PutAll(begun3->upload_id, v3).ok());
  EXPECT_TRUE(fs::exists(VersionDir("team%2Fjob%3A1", 2)));

  ASSERT_NO_FATAL_FAILURE(Reopen());
  for (const transfer::TestAdapter* adapter : {&v1_adapter, &v2, &other}) {
    absl::StatusOr<std::shared_ptr<const CommittedVersion>> found =
        store_->Find(adapter->manifest.adapter_name(), adapter->manifest.version(), 0);
    ASSERT_TRUE(found.ok()) << found.status();
    ExpectHolds(**found, *adapter);
  }
  EXPECT_EQ(store_->Newest("team/job:1").DebugString(), committed2->version.DebugString());
  ExpectNotFound("team/job:1", 3);
  EXPECT_FALSE(fs::exists(VersionDir("team%2Fjob%3A1", 3)));
  const AdapterStore::Totals totals = store_->totals();
  EXPECT_EQ(totals.versions, 3);
  EXPECT_EQ(totals.bytes,
            static_cast<int64_t>(TotalBytes(v1_adapter) + TotalBytes(v2) + TotalBytes(other)));
  EXPECT_EQ(totals.open_uploads, 0);
  absl::Status forgotten = store_->Commit(begun3->upload_id).status();
  EXPECT_TRUE(absl::IsNotFound(forgotten)) << forgotten;

  // The version rules hold across the restart; the lost upload can be redone.
  const absl::Status again = store_->Begin(v2.manifest, false).status();
  EXPECT_TRUE(absl::IsAlreadyExists(again)) << again;
  EXPECT_TRUE(absl::IsAlreadyExists(
      store_->Begin(transfer::MakeTestAdapter("team/job:1", 1, 23).manifest, false).status()));
  absl::StatusOr<AdapterStore::CommitOutcome> redone = Publish(v3);
  ASSERT_TRUE(redone.ok()) << redone.status();
  EXPECT_EQ(redone->version.version(), 3);
}

TEST_F(AdapterStoreTest, ReopeningIgnoresAndRemovesAPartiallyWrittenVersion) {
  ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-1", 1, 24)).ok());
  // Version 2 as a write interrupted just before its rename: every file is there and valid.
  const transfer::TestAdapter v2 = transfer::MakeTestAdapter("job-1", 2, 25);
  const fs::path partial = VersionDir("job-1", 2) + ".partial";
  ASSERT_TRUE(fs::create_directories(partial));
  std::ofstream(partial / "manifest.binpb", std::ios::binary) << v2.manifest.SerializeAsString();
  for (size_t i = 0; i < v2.shards.size(); ++i) {
    std::ofstream(partial / absl::StrCat("shard-", i, ".bin"), std::ios::binary) << v2.shards[i];
  }

  ASSERT_NO_FATAL_FAILURE(Reopen());
  ExpectNotFound("job-1", 2);
  EXPECT_EQ(store_->Newest("job-1").version(), 1);
  EXPECT_EQ(store_->totals().versions, 1);
  EXPECT_FALSE(fs::exists(partial));
  // Version 2 can still be published.
  absl::StatusOr<AdapterStore::CommitOutcome> committed = Publish(v2);
  ASSERT_TRUE(committed.ok()) << committed.status();
  absl::StatusOr<std::shared_ptr<const CommittedVersion>> found = store_->Find("job-1", 2, 0);
  ASSERT_TRUE(found.ok()) << found.status();
  ExpectHolds(**found, v2);
}

TEST_F(AdapterStoreTest, AVersionLostBeforeItWasDurableKeepsItsNumberBoundToItsManifest) {
  ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-1", 1, 40)).ok());
  const transfer::TestAdapter v3 = transfer::MakeTestAdapter("job-1", 3, 41);
  // The data directory as it is when watchers hear of version 3: what a crash then leaves.
  const std::string at_announcement = data_dir_ + "_at_announcement";
  fs::remove_all(at_announcement);
  bool durable_when_announced = true;
  store_->Watch("job-1", [&](const weightstore::v1::VersionInfo& info) {
    durable_when_announced = fs::exists(VersionDir("job-1", info.version()));
    fs::copy(data_dir_, at_announcement, fs::copy_options::recursive);
  });
  absl::StatusOr<AdapterStore::CommitOutcome> committed = Publish(v3);
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_FALSE(durable_when_announced) << "watchers heard of version 3 only after its fsync";
  EXPECT_TRUE(fs::exists(VersionDir("job-1", 3)));
  EXPECT_FALSE(fs::exists(VersionDir("job-1", 3) + ".announced"));

  // Restarted from that crash: version 3 is not served, its number keeps its manifest, and no
  // version below it is taken (watchers may hold it: versions only increase).
  fs::remove_all(data_dir_);
  fs::rename(at_announcement, data_dir_);
  ASSERT_NO_FATAL_FAILURE(Reopen());
  EXPECT_EQ(store_->Newest("job-1").version(), 1);
  const absl::Status lost = store_->Find("job-1", 3, 0).status();
  EXPECT_TRUE(absl::IsNotFound(lost)) << lost;
  EXPECT_THAT(lost.message(), HasSubstr("lost before it was durable"));
  const transfer::TestAdapter other_bytes = transfer::MakeTestAdapter("job-1", 3, 42);
  const absl::Status refused = store_->Begin(other_bytes.manifest, false).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("announced with another manifest"));
  const absl::Status below =
      store_->Begin(transfer::MakeTestAdapter("job-1", 2, 44).manifest, false).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(below)) << below;
  EXPECT_THAT(below.message(), HasSubstr("< newest 3"));

  // A retry whose bytes fail their check leaves the number bound as it was.
  absl::StatusOr<BeginResult> retry = store_->Begin(v3.manifest, false);
  ASSERT_TRUE(retry.ok()) << retry.status();
  ASSERT_TRUE(PutAll(retry->upload_id, v3).ok());
  std::string corrupt = v3.shards[0];
  corrupt[0] ^= 1;
  ASSERT_TRUE(store_->Put(retry->upload_id, 0, 0, corrupt).ok());
  EXPECT_TRUE(absl::IsAborted(store_->Commit(retry->upload_id).status()));
  ASSERT_TRUE(store_->Abort(retry->upload_id).ok());
  ASSERT_NO_FATAL_FAILURE(Reopen());
  EXPECT_TRUE(absl::IsFailedPrecondition(store_->Begin(other_bytes.manifest, false).status()));

  // Published again as announced, it is served; once durable there is nothing left to remember.
  ASSERT_TRUE(Publish(v3).ok());
  absl::StatusOr<std::shared_ptr<const CommittedVersion>> found = store_->Find("job-1", 3, 0);
  ASSERT_TRUE(found.ok()) << found.status();
  ExpectHolds(**found, v3);
  EXPECT_FALSE(fs::exists(VersionDir("job-1", 3) + ".announced"));
  ASSERT_NO_FATAL_FAILURE(Reopen());
  EXPECT_TRUE(absl::IsAlreadyExists(store_->Begin(other_bytes.manifest, false).status()));
  ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-1", 4, 43)).ok());
}

TEST_F(AdapterStoreTest, AWithdrawnVersionsLeasedMemoryIsKeptFromNewUploads) {
  ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-1", 1, 50)).ok());
  const transfer::TestAdapter v2 = transfer::MakeTestAdapter("job-1", 2, 51);
  // A reader leases version 2 as it hears of it; then a directory in the version's final place
  // makes its write fail (the rename), a real failure on the real filesystem.
  std::set<const char*> leased_memory;
  std::string lease_id;
  const int64_t watch = store_->Watch("job-1", [&](const weightstore::v1::VersionInfo& info) {
    absl::StatusOr<AdapterStore::Lease> lease =
        store_->AcquireLease("job-1", info.version(), "reader", absl::Minutes(1));
    ASSERT_TRUE(lease.ok()) << lease.status();
    lease_id = lease->id;
    for (const auto& shard : (*store_->Find("job-1", info.version(), 0))->shards) {
      leased_memory.insert(shard->data());
    }
    fs::create_directories(fs::path(VersionDir("job-1", info.version())) / "in-the-way");
  });
  const absl::Status failed = Publish(v2).status();
  store_->Unwatch(watch);
  EXPECT_FALSE(failed.ok());
  EXPECT_THAT(failed.message(), HasSubstr("withdrawn"));
  EXPECT_TRUE(absl::IsNotFound(store_->Find("job-1", 2, 0).status()));
  EXPECT_EQ(store_->Newest("job-1").version(), 1);

  // Published again, the directory cleared: not into the memory the reader still reads.
  fs::remove_all(VersionDir("job-1", 2));
  ASSERT_TRUE(Publish(v2).ok());
  absl::StatusOr<std::shared_ptr<const CommittedVersion>> found = store_->Find("job-1", 2, 0);
  ASSERT_TRUE(found.ok()) << found.status();
  ExpectHolds(**found, v2);
  ASSERT_FALSE(leased_memory.empty());
  for (const auto& shard : (*found)->shards) {
    EXPECT_FALSE(leased_memory.contains(shard->data())) << "a leased, withdrawn shard reused";
  }
  store_->ReleaseLease(lease_id);
  store_->ExpireAndRetain(clock_.Now());
}

TEST_F(AdapterStoreTest, ReopeningSkipsAStoredVersionWithACorruptShard) {
  const transfer::TestAdapter first = transfer::MakeTestAdapter("job-1", 1, 26);
  ASSERT_TRUE(Publish(first).ok());
  ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-1", 2, 27)).ok());
  const fs::path shard = fs::path(VersionDir("job-1", 2)) / "shard-0.bin";
  ASSERT_TRUE(tandem::testing::FlipByte(shard.string(), 3, std::ios::beg, 1));

  ASSERT_NO_FATAL_FAILURE(Reopen());
  ExpectNotFound("job-1", 2);
  EXPECT_EQ(store_->Newest("job-1").version(), 1);
  absl::StatusOr<std::shared_ptr<const CommittedVersion>> found = store_->Find("job-1", 1, 0);
  ASSERT_TRUE(found.ok()) << found.status();
  ExpectHolds(**found, first);
}

// Fails today: the corrupt version is skipped at recovery but its directory stays, so the commit
// that publishes that version again cannot rename its ".partial" directory over it (UNAVAILABLE
// "cannot rename"). Enable once recovery (or WriteVersion) clears such a directory.
TEST_F(AdapterStoreTest, AManifestEditedOnDiskIsNotServed) {
  const transfer::TestAdapter adapter = transfer::MakeTestAdapter("job-1", 1, 27);
  ASSERT_TRUE(Publish(adapter).ok());
  const std::string manifest = VersionDir("job-1", 1) + "/manifest.binpb";
  std::string bytes;
  {
    std::ifstream in(manifest, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  // The LoRA alpha, a float inside the manifest: change its lowest byte (16 -> 16.000002).
  const float alpha = adapter.manifest.lora().alpha();
  std::string alpha_bytes(reinterpret_cast<const char*>(&alpha), sizeof(alpha));
  const size_t at = bytes.find(alpha_bytes);
  ASSERT_NE(at, std::string::npos) << "alpha " << alpha << " not found in the stored manifest";
  bytes[at] ^= 1;
  { std::ofstream(manifest, std::ios::binary | std::ios::trunc) << bytes; }
  ASSERT_NO_FATAL_FAILURE(Reopen());
  ExpectNotFound("job-1", 1);
  EXPECT_TRUE(fs::exists(VersionDir("job-1", 1) + ".corrupt"));
}

TEST_F(AdapterStoreTest, ASkippedCorruptVersionIsMovedAsideAndCanBePublishedAgain) {
  ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-1", 1, 28)).ok());
  const transfer::TestAdapter v2 = transfer::MakeTestAdapter("job-1", 2, 29);
  ASSERT_TRUE(Publish(v2).ok());
  fs::resize_file(fs::path(VersionDir("job-1", 2)) / "shard-0.bin", 1);

  ASSERT_NO_FATAL_FAILURE(Reopen());
  ExpectNotFound("job-1", 2);
  EXPECT_TRUE(fs::exists(VersionDir("job-1", 2) + ".corrupt"));
  absl::StatusOr<AdapterStore::CommitOutcome> again = Publish(v2);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_NO_FATAL_FAILURE(Reopen());
  absl::StatusOr<std::shared_ptr<const CommittedVersion>> found = store_->Find("job-1", 2, 0);
  ASSERT_TRUE(found.ok()) << found.status();
  ExpectHolds(**found, v2);
}

TEST_F(AdapterStoreTest, RetentionKeepsTheNewestVersionsAndAppliesOnReopen) {
  ASSERT_NO_FATAL_FAILURE(Reopen(/*keep_versions=*/2));
  std::vector<transfer::TestAdapter> versions;
  for (int64_t version = 1; version <= 4; ++version) {
    versions.push_back(transfer::MakeTestAdapter("job-1", version, 30 + version));
    ASSERT_TRUE(Publish(versions.back()).ok()) << version;
  }
  ExpectNotFound("job-1", 1);
  ExpectNotFound("job-1", 2);
  EXPECT_FALSE(fs::exists(VersionDir("job-1", 1)));
  EXPECT_FALSE(fs::exists(VersionDir("job-1", 2)));
  for (int64_t version : {3, 4}) {
    absl::StatusOr<std::shared_ptr<const CommittedVersion>> found =
        store_->Find("job-1", version, 0);
    ASSERT_TRUE(found.ok()) << found.status();
    ExpectHolds(**found, versions[version - 1]);
  }
  EXPECT_EQ(store_->totals().versions, 2);
  // A retired version cannot be published again.
  EXPECT_TRUE(absl::IsFailedPrecondition(store_->Begin(versions[1].manifest, false).status()));

  ASSERT_NO_FATAL_FAILURE(Reopen(/*keep_versions=*/1));
  ExpectNotFound("job-1", 3);
  EXPECT_FALSE(fs::exists(VersionDir("job-1", 3)));
  EXPECT_EQ(store_->Newest("job-1").version(), 4);
  EXPECT_EQ(store_->totals().versions, 1);
}

// A retired version's files are set aside and the next version is written over them: fewer
// shards or shorter ones leave nothing of the old version behind, and recovery reads it whole.
TEST_F(AdapterStoreTest, NewVersionsAreWrittenOverTheFilesOfRetiredOnes) {
  ASSERT_NO_FATAL_FAILURE(Reopen(/*keep_versions=*/1));
  const auto inode = [](const std::string& path) {
    struct stat info {};
    return ::stat(path.c_str(), &info) == 0 ? info.st_ino : 0;
  };
  const auto files = [](const std::string& dir) {
    std::set<std::string> names;
    for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
      names.insert(entry.path().filename().string());
    }
    return names;
  };
  ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-1", 1, 41)).ok());
  const ino_t first_shard = inode(VersionDir("job-1", 1) + "/shard-0.bin");
  ASSERT_NE(first_shard, 0);
  ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-1", 2, 42)).ok());  // Retires version 1.
  EXPECT_EQ(files(data_dir_ + "/job-1"), (std::set<std::string>{"2", "retired"}));

  // Version 3 has one shard where version 1 had four, of other sizes.
  const transfer::TestAdapter third =
      transfer::MakeTestAdapter("job-1", 3, 43, {.tp_size = 1, .ep_size = 1});
  ASSERT_EQ(third.shards.size(), 1);
  ASSERT_TRUE(Publish(third).ok());
  EXPECT_EQ(inode(VersionDir("job-1", 3) + "/shard-0.bin"), first_shard);
  EXPECT_EQ(files(VersionDir("job-1", 3)),
            (std::set<std::string>{"manifest.binpb", "shard-0.bin"}));
  EXPECT_EQ(fs::file_size(VersionDir("job-1", 3) + "/shard-0.bin"), third.shards[0].size());
  EXPECT_EQ(files(data_dir_ + "/job-1"), (std::set<std::string>{"3", "retired"}));

  ASSERT_NO_FATAL_FAILURE(Reopen(/*keep_versions=*/1));  // Verifies every shard's checksum.
  absl::StatusOr<std::shared_ptr<const CommittedVersion>> found = store_->Find("job-1", 3, 0);
  ASSERT_TRUE(found.ok()) << found.status();
  ExpectHolds(**found, third);
  EXPECT_EQ(files(data_dir_ + "/job-1"), (std::set<std::string>{"3"}));
}

// Whatever the files set aside have become, the next version is written into plain files of
// its own: never through a symlink, and not into a directory.
TEST_F(AdapterStoreTest, RetiredEntriesThatAreNotPlainFilesAreReplaced) {
  ASSERT_NO_FATAL_FAILURE(Reopen(/*keep_versions=*/1));
  ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-1", 1, 51)).ok());
  ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-1", 2, 52)).ok());  // Retires version 1.
  const fs::path retired = fs::path(data_dir_) / "job-1" / "retired";
  const fs::path outside = fs::path(data_dir_) / "outside.bin";
  std::ofstream(outside) << "keep";
  ASSERT_TRUE(fs::remove(retired / "shard-0.bin"));
  fs::create_symlink(outside, retired / "shard-0.bin");
  ASSERT_TRUE(fs::remove(retired / "shard-1.bin"));
  fs::create_directory(retired / "shard-1.bin");

  const transfer::TestAdapter third = transfer::MakeTestAdapter("job-1", 3, 53);
  ASSERT_TRUE(Publish(third).ok());
  std::ifstream in(outside);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "keep");
  ASSERT_NO_FATAL_FAILURE(Reopen(/*keep_versions=*/1));  // Verifies every shard's checksum.
  absl::StatusOr<std::shared_ptr<const CommittedVersion>> found = store_->Find("job-1", 3, 0);
  ASSERT_TRUE(found.ok()) << found.status();
  ExpectHolds(**found, third);
}

TEST_F(AdapterStoreTest, KeepsAtLeastTheNewestVersion) {
  EXPECT_TRUE(absl::IsInvalidArgument(
      AdapterStore::Open({.data_dir = data_dir_, .keep_versions = 0}).status()));
}

TEST_F(AdapterStoreTest, ALeaseKeepsItsVersionUntilReleased) {
  ASSERT_NO_FATAL_FAILURE(Reopen(/*keep_versions=*/1));
  const transfer::TestAdapter leased_adapter = transfer::MakeTestAdapter("job-1", 1, 40);
  ASSERT_TRUE(Publish(leased_adapter).ok());
  const absl::Time before = clock_.Now();
  absl::StatusOr<AdapterStore::Lease> lease =
      store_->AcquireLease("job-1", 1, "replica-0", absl::Minutes(1));
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_GE(lease->expire_time, before + absl::Minutes(1));
  EXPECT_EQ(store_->totals().leases, 1);

  absl::StatusOr<std::shared_ptr<const CommittedVersion>> leased =
      store_->LeasedVersion(lease->id, "job-1", 1);
  ASSERT_TRUE(leased.ok()) << leased.status();
  ExpectHolds(**leased, leased_adapter);
  absl::Status other_version = store_->LeasedVersion(lease->id, "job-1", 2).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(other_version)) << other_version;
  EXPECT_THAT(other_version.message(), HasSubstr("is for job-1@1"));
  EXPECT_TRUE(absl::IsFailedPrecondition(store_->LeasedVersion(lease->id, "job-2", 1).status()));

  ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-1", 2, 41)).ok());
  ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-1", 3, 42)).ok());
  store_->ExpireAndRetain(clock_.Now());
  absl::StatusOr<std::shared_ptr<const CommittedVersion>> kept = store_->Find("job-1", 1, 0);
  ASSERT_TRUE(kept.ok()) << kept.status();  // Leased: kept past keep_versions.
  EXPECT_EQ(kept->get(), leased->get());
  EXPECT_TRUE(fs::exists(VersionDir("job-1", 1)));
  ExpectNotFound("job-1", 2);  // Not leased: retired.
  EXPECT_FALSE(fs::exists(VersionDir("job-1", 2)));
  EXPECT_EQ(store_->totals().versions, 2);
  absl::Status retired = store_->AcquireLease("job-1", 2, "replica-0", absl::Minutes(1)).status();
  EXPECT_TRUE(absl::IsNotFound(retired)) << retired;
  EXPECT_TRUE(
      absl::IsNotFound(store_->AcquireLease("job-9", 1, "replica-0", absl::Minutes(1)).status()));

  store_->ReleaseLease(lease->id);
  EXPECT_EQ(store_->totals().leases, 0);
  absl::Status released = store_->LeasedVersion(lease->id, "job-1", 1).status();
  EXPECT_TRUE(absl::IsNotFound(released)) << released;
  EXPECT_THAT(released.message(), HasSubstr("not found or expired"));
  EXPECT_TRUE(absl::IsNotFound(store_->RenewLease(lease->id, absl::Minutes(1)).status()));
  store_->ReleaseLease(lease->id);  // Idempotent.
  store_->ExpireAndRetain(clock_.Now());
  ExpectNotFound("job-1", 1);
  EXPECT_FALSE(fs::exists(VersionDir("job-1", 1)));
  // A reader that took the version before keeps its bytes.
  ExpectHolds(**leased, leased_adapter);
  EXPECT_EQ(store_->Newest("job-1").version(), 3);
}

TEST_F(AdapterStoreTest, ARenewedLeaseKeepsItsVersionUntilItExpires) {
  ASSERT_NO_FATAL_FAILURE(Reopen(/*keep_versions=*/1));
  ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-1", 1, 43)).ok());
  absl::StatusOr<AdapterStore::Lease> lease =
      store_->AcquireLease("job-1", 1, "replica-0", absl::Minutes(1));
  ASSERT_TRUE(lease.ok()) << lease.status();
  absl::StatusOr<absl::Time> renewed = store_->RenewLease(lease->id, absl::Minutes(2));
  ASSERT_TRUE(renewed.ok()) << renewed.status();
  EXPECT_GE(*renewed, lease->expire_time + absl::Minutes(1));
  ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-1", 2, 44)).ok());

  // Past the first ttl, within the renewed one.
  store_->ExpireAndRetain(clock_.Now() + absl::Seconds(90));
  EXPECT_TRUE(store_->Find("job-1", 1, 0).ok());
  EXPECT_EQ(store_->totals().leases, 1);
  // Past the renewed ttl: the lease is dropped and its version retired.
  store_->ExpireAndRetain(*renewed + absl::Seconds(1));
  EXPECT_EQ(store_->totals().leases, 0);
  ExpectNotFound("job-1", 1);
  EXPECT_FALSE(fs::exists(VersionDir("job-1", 1)));
  EXPECT_TRUE(store_->Find("job-1", 2, 0).ok());
  absl::Status expired = store_->RenewLease(lease->id, absl::Minutes(1)).status();
  EXPECT_TRUE(absl::IsNotFound(expired)) << expired;
  EXPECT_THAT(expired.message(), HasSubstr("not found or expired"));
}

TEST_F(AdapterStoreTest, AnExpiredLeaseStopsPinningBeforeTheSweep) {
  ASSERT_NO_FATAL_FAILURE(Reopen(/*keep_versions=*/1));
  ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-1", 1, 45)).ok());
  absl::StatusOr<AdapterStore::Lease> lease =
      store_->AcquireLease("job-1", 1, "replica-0", absl::Milliseconds(10));
  ASSERT_TRUE(lease.ok()) << lease.status();
  clock_.Advance(absl::Milliseconds(20));

  EXPECT_TRUE(absl::IsNotFound(store_->LeasedVersion(lease->id, "job-1", 1).status()));
  EXPECT_TRUE(absl::IsNotFound(store_->RenewLease(lease->id, absl::Minutes(1)).status()));
  ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-1", 2, 46)).ok());  // Retention at commit.
  ExpectNotFound("job-1", 1);
  EXPECT_EQ(store_->totals().leases, 1);  // Dropped by the next sweep.
  store_->ExpireAndRetain(clock_.Now());
  EXPECT_EQ(store_->totals().leases, 0);
}

TEST_F(AdapterStoreTest, TheSweepDropsExpiredUploads) {
  const transfer::TestAdapter adapter = transfer::MakeTestAdapter("job-1", 1, 47);
  absl::StatusOr<BeginResult> begun = store_->Begin(adapter.manifest, false);
  ASSERT_TRUE(begun.ok()) << begun.status();
  ASSERT_TRUE(store_->Put(begun->upload_id, 0, 0, adapter.shards[0]).ok());
  store_->ExpireAndRetain(clock_.Now());
  EXPECT_EQ(store_->totals().open_uploads, 1);  // Not expired yet.

  store_->ExpireAndRetain(clock_.Now() + absl::Minutes(2));
  EXPECT_EQ(store_->totals().open_uploads, 0);
  absl::Status put = store_->Put(begun->upload_id, 0, 0, adapter.shards[0]).status();
  EXPECT_TRUE(absl::IsNotFound(put)) << put;
  EXPECT_THAT(put.message(), HasSubstr("not found (or expired)"));
  EXPECT_TRUE(absl::IsNotFound(store_->Commit(begun->upload_id).status()));

  // The version was never taken: a new upload publishes it. Once its record is swept, a retried
  // commit is unknown, while the version stays.
  absl::StatusOr<BeginResult> again = store_->Begin(adapter.manifest, false);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NE(again->upload_id, begun->upload_id);
  ASSERT_TRUE(PutAll(again->upload_id, adapter).ok());
  ASSERT_TRUE(store_->Commit(again->upload_id).ok());
  store_->ExpireAndRetain(clock_.Now() + absl::Minutes(2));
  EXPECT_TRUE(absl::IsNotFound(store_->Commit(again->upload_id).status()));
  EXPECT_TRUE(store_->Find("job-1", 1, 0).ok());
}

TEST_F(AdapterStoreTest, PutKeepsAnUploadAlive) {
  const transfer::TestAdapter adapter = transfer::MakeTestAdapter("job-1", 1, 48);
  absl::StatusOr<BeginResult> begun = store_->Begin(adapter.manifest, false);
  ASSERT_TRUE(begun.ok()) << begun.status();
  clock_.Advance(absl::Milliseconds(5));
  ASSERT_TRUE(store_->Put(begun->upload_id, 0, 0, adapter.shards[0]).ok());
  // Past the expiry Begin returned, but the put moved it.
  store_->ExpireAndRetain(begun->expire_time + absl::Milliseconds(1));
  EXPECT_EQ(store_->totals().open_uploads, 1);
  ASSERT_TRUE(PutAll(begun->upload_id, adapter).ok());
  EXPECT_TRUE(store_->Commit(begun->upload_id).ok());
}

TEST_F(AdapterStoreTest, AnUploadPastItsExpiryIsGoneBeforeTheSweep) {
  ASSERT_NO_FATAL_FAILURE(Reopen(/*keep_versions=*/3, /*upload_expiry=*/absl::Milliseconds(20)));
  const transfer::TestAdapter adapter = transfer::MakeTestAdapter("job-1", 1, 49);
  absl::StatusOr<BeginResult> begun = store_->Begin(adapter.manifest, false);
  ASSERT_TRUE(begun.ok()) << begun.status();
  clock_.Advance(absl::Milliseconds(40));
  absl::Status put = store_->Put(begun->upload_id, 0, 0, adapter.shards[0]).status();
  EXPECT_TRUE(absl::IsNotFound(put)) << put;
  absl::Status commit = store_->Commit(begun->upload_id).status();
  EXPECT_TRUE(absl::IsNotFound(commit)) << commit;
  EXPECT_THAT(commit.message(), HasSubstr("not found (or expired)"));
  ExpectNotFound("job-1", 1);
  // Beginning the same version again starts afresh rather than reviving the expired upload
  // with whatever bytes it had.
  absl::StatusOr<BeginResult> again = store_->Begin(adapter.manifest, false);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NE(again->upload_id, begun->upload_id);
}

TEST_F(AdapterStoreTest, ALeaseNamesAnExactVersion) {
  ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-1", 1, 50)).ok());
  for (int64_t version : {0, -1}) {
    absl::Status status =
        store_->AcquireLease("job-1", version, "replica-0", absl::Minutes(1)).status();
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
    EXPECT_THAT(status.message(), HasSubstr("must be >= 1"));
  }
  EXPECT_EQ(store_->totals().leases, 0);
}

}  // namespace
}  // namespace tandem::weight_store
