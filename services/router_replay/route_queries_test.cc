// FetchRoutes planning and streaming against a real store, where a test can put a delete at an
// exact point of a fetch: after the record was looked up, before or between its messages.
#include "services/router_replay/route_queries.h"

#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/router_replay/client/testing/route_testing.h"

namespace tandem::router_replay {
namespace {

using ::testing::HasSubstr;

class FetchOfADeletedRecordTest : public ::testing::Test {
 protected:
  // 64 KiB messages hold 1024 rows of this shape (48 bytes), so the record takes 3 messages.
  static constexpr int64_t kRows = 3000;
  static constexpr int64_t kRowsPerMessage = 1024;

  void SetUp() override {
    const std::string path = ::testing::TempDir() + "/route_queries_" +
                             ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(path);
    absl::StatusOr<std::unique_ptr<RouteStore>> store = RouteStore::Open({.path = path});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    rows_ = SyntheticRoutes(shape_, kRows, 1);
    for (const RecordKey& key : {doomed_, kept_}) {
      ASSERT_TRUE(store_
                      ->Append({.key = key,
                                .shape = shape_,
                                .first_row = 0,
                                .num_rows = kRows,
                                .rows = rows_.data(),
                                .seal = true})
                      .ok());
    }
  }

  FetchCursor StartFetch(bool allow_partial) {
    routerreplay::v1::FetchRoutesRequest request;
    for (const RecordKey& key : {doomed_, kept_}) {
      *request.mutable_records()->add_records()->mutable_key() = ToProto(key);
    }
    request.set_max_chunk_bytes(64 << 10);
    request.set_allow_partial(allow_partial);
    absl::StatusOr<FetchPlan> plan = PlanFetch(*store_, request);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return FetchCursor(*store_, plan.ok() ? *std::move(plan) : FetchPlan());
  }

  // What DeleteRecords does for the doomed record's job.
  void DeleteDoomed() {
    absl::StatusOr<DeleteOutcome> deleted = store_->DeleteJob(doomed_.job_id, 0, 0);
    ASSERT_TRUE(deleted.ok()) << deleted.status();
    ASSERT_EQ(deleted->records, 1);
  }

  // The cursor's next message, which must exist.
  static routerreplay::v1::FetchRoutesResponse NextOf(FetchCursor& cursor) {
    absl::StatusOr<std::optional<routerreplay::v1::FetchRoutesResponse>> next = cursor.Next();
    EXPECT_TRUE(next.ok()) << next.status();
    if (!next.ok() || !next->has_value()) {
      ADD_FAILURE() << "the fetch ended early";
      return {};
    }
    return **std::move(next);
  }

  // Whether a message carries the stored rows it claims, from its row offset on.
  bool HoldsStoredRows(const routerreplay::v1::FetchRoutesResponse& message) const {
    const size_t bytes = message.num_rows() * shape_.ids_per_row() * sizeof(int16_t);
    const int16_t* stored = rows_.data() + message.row_offset() * shape_.ids_per_row();
    return message.rows().size() == bytes && std::memcmp(message.rows().data(), stored, bytes) == 0;
  }

  const RecordKey doomed_{.job_id = "doomed", .policy_version = 1, .sample_id = "s"};
  const RecordKey kept_{.job_id = "kept", .policy_version = 1, .sample_id = "s"};
  RouteShape shape_{.layers = {1, 2, 4}, .top_k = 8, .num_experts = 64};
  std::vector<int16_t> rows_;
  std::unique_ptr<RouteStore> store_;
};

// The race of the report: the record was looked up when the fetch was planned, then deleted
// before its rows were read. Without allow_partial the stream ends NOT_FOUND naming it.
TEST_F(FetchOfADeletedRecordTest, DeletedBeforeItsRowsAreReadIsNotFound) {
  FetchCursor cursor = StartFetch(/*allow_partial=*/false);
  ASSERT_NO_FATAL_FAILURE(DeleteDoomed());
  absl::StatusOr<std::optional<routerreplay::v1::FetchRoutesResponse>> next = cursor.Next();
  ASSERT_FALSE(next.ok()) << "the deleted record was sent as rows";
  EXPECT_EQ(next.status().code(), absl::StatusCode::kNotFound) << next.status();
  EXPECT_THAT(next.status().message(), HasSubstr("doomed/v1/s#0 was deleted while being read"));
}

// With allow_partial (the trainer's fetch) the record ends MISSING where it was cut, and the
// fetch goes on to the next record.
TEST_F(FetchOfADeletedRecordTest, DeletedBetweenItsMessagesEndsMissingAndTheFetchGoesOn) {
  FetchCursor cursor = StartFetch(/*allow_partial=*/true);
  const routerreplay::v1::FetchRoutesResponse first = NextOf(cursor);
  EXPECT_EQ(first.status(), routerreplay::v1::RECORD_STATUS_COMPLETE);
  EXPECT_EQ(first.num_rows(), kRowsPerMessage);
  EXPECT_TRUE(HoldsStoredRows(first));

  ASSERT_NO_FATAL_FAILURE(DeleteDoomed());
  const routerreplay::v1::FetchRoutesResponse cut = NextOf(cursor);
  EXPECT_EQ(FromProto(cut.key()), doomed_);
  EXPECT_EQ(cut.status(), routerreplay::v1::RECORD_STATUS_MISSING);
  EXPECT_EQ(cut.row_offset(), kRowsPerMessage);
  EXPECT_EQ(cut.num_rows(), 0);
  EXPECT_TRUE(cut.rows().empty());

  int64_t kept_rows = 0;
  for (absl::StatusOr<std::optional<routerreplay::v1::FetchRoutesResponse>> next = cursor.Next();
       next.ok() && next->has_value(); next = cursor.Next()) {
    const routerreplay::v1::FetchRoutesResponse& message = **next;
    EXPECT_EQ(FromProto(message.key()), kept_);
    EXPECT_EQ(message.status(), routerreplay::v1::RECORD_STATUS_COMPLETE);
    EXPECT_TRUE(HoldsStoredRows(message));
    kept_rows += message.num_rows();
  }
  EXPECT_EQ(kept_rows, kRows);
}

}  // namespace
}  // namespace tandem::router_replay
