// The router-replay service through gRPC on loopback: the paths rollout and trainer use (the
// appender and the replay fetch), every validation rule, selection, sharding, statistics,
// placement, deletion and metrics.
#include "services/router_replay/router_replay_service.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "common/channel.h"
#include "common/server.h"
#include "common/status.h"
#include "common/testing/error_details.h"
#include "common/testing/http_get.h"
#include "common/testing/test_server.h"
#include "engine/config.h"
#include "engine/cpu_model_ops.h"
#include "engine/generator.h"
#include "engine/model.h"
#include "engine/transformer.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/client_interceptor.h"
#include "gtest/gtest.h"
#include "services/router_replay/client/replay_fetch.h"
#include "services/router_replay/client/route_appender.h"
#include "services/router_replay/client/testing/route_testing.h"
#include "services/router_replay/route_queries.h"

namespace tandem::router_replay {
namespace {

using ::testing::HasSubstr;

class RouterReplayServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = ::testing::TempDir() + "/router_replay_service_test";
    std::filesystem::remove_all(dir);
    auto service = RouterReplayServiceImpl::Create({.store = {.path = dir}});
    ASSERT_TRUE(service.ok()) << service.status();
    ServerOptions options = tandem::testing::LoopbackOptions();
    options.max_message_bytes = 8 << 20;
    auto started = tandem::testing::StartLoopbackServer(
        "router-replay", {"tandem.routerreplay.v1.RouterReplayService", *std::move(service)},
        options);
    ASSERT_TRUE(started.ok()) << started.status();
    channel_ = new std::shared_ptr<grpc::Channel>(started->Channel());
    server_ = started->server.release();
  }

  static void TearDownTestSuite() {
    delete channel_;
    delete server_;
  }

  void SetUp() override { stub_ = routerreplay::v1::RouterReplayService::NewStub(*channel_); }

  // A job id of its own for every test, so tests sharing the server never see each other.
  static std::string Job() {
    return ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }

  static RecordKey Key(absl::string_view sample, int64_t version = 1, int attempt = 0) {
    return {.job_id = Job(),
            .policy_version = version,
            .sample_id = std::string(sample),
            .attempt = attempt};
  }

  routerreplay::v1::AppendRequest Chunk(const RecordKey& key, const std::vector<int16_t>& rows,
                                        int64_t first, int64_t count, bool seal = false) const {
    return AppendRequestFor(key, shape_, first, count, rows.data() + first * shape_.ids_per_row(),
                            seal);
  }

  grpc::Status Append(const std::vector<routerreplay::v1::AppendRequest>& chunks,
                      routerreplay::v1::AppendResponse* response = nullptr) {
    routerreplay::v1::AppendResponse unused;
    grpc::ClientContext context;
    SetTimeout(context, absl::Seconds(20));
    auto writer = stub_->Append(&context, response != nullptr ? response : &unused);
    for (const auto& chunk : chunks) {
      if (!writer->Write(chunk)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  }

  // Stores rows [0, n) of a record in one sealed chunk.
  void Store(const RecordKey& key, const std::vector<int16_t>& rows, bool seal = true) {
    const int64_t n = static_cast<int64_t>(rows.size()) / shape_.ids_per_row();
    ASSERT_TRUE(Append({Chunk(key, rows, 0, n, seal)}).ok());
  }

  grpc::Status Fetch(const routerreplay::v1::FetchRoutesRequest& request,
                     std::vector<routerreplay::v1::FetchRoutesResponse>* messages) {
    grpc::ClientContext context;
    SetTimeout(context, absl::Seconds(20));
    auto reader = stub_->FetchRoutes(&context, request);
    routerreplay::v1::FetchRoutesResponse message;
    while (reader->Read(&message)) messages->push_back(message);
    return reader->Finish();
  }

  static routerreplay::v1::FetchRoutesRequest Named(const std::vector<RecordKey>& keys) {
    routerreplay::v1::FetchRoutesRequest request;
    for (const RecordKey& key : keys) {
      *request.mutable_records()->add_records()->mutable_key() = ToProto(key);
    }
    return request;
  }

  static std::vector<int16_t> RowsOf(
      const std::vector<routerreplay::v1::FetchRoutesResponse>& messages) {
    std::vector<int16_t> rows;
    for (const auto& message : messages) {
      const auto* ids = reinterpret_cast<const int16_t*>(message.rows().data());
      rows.insert(rows.end(), ids, ids + message.rows().size() / 2);
    }
    return rows;
  }

  static ServiceServer* server_;
  static std::shared_ptr<grpc::Channel>* channel_;
  std::unique_ptr<routerreplay::v1::RouterReplayService::Stub> stub_;
  RouteShape shape_{.layers = {1, 3, 4}, .top_k = 2, .num_experts = 16};  // 0 and 2 dense.
};

ServiceServer* RouterReplayServiceTest::server_ = nullptr;
std::shared_ptr<grpc::Channel>* RouterReplayServiceTest::channel_ = nullptr;

TEST_F(RouterReplayServiceTest, DecodeStyleAppendsComeBackInTheEngineReplayLayout) {
  RouteAppender appender(*channel_);
  constexpr int kRecords = 8, kTokens = 21;  // 20 rows each.
  std::vector<std::vector<int16_t>> routes;
  for (int r = 0; r < kRecords; ++r) routes.push_back(SyntheticRoutes(shape_, kTokens - 1, r));
  for (int row = 0; row < kTokens - 1; ++row) {  // One row per record per decode step.
    for (int r = 0; r < kRecords; ++r) {
      ASSERT_TRUE(appender
                      .Append(Key(absl::StrCat("s", r)), shape_, row, 1,
                              routes[r].data() + row * shape_.ids_per_row(), row == kTokens - 2)
                      .ok());
    }
  }
  std::vector<ReplaySequence> sequences;
  for (int r = 0; r < kRecords; ++r) {
    ASSERT_TRUE(
        appender.WaitForRecord(Key(absl::StrCat("s", r)), absl::Now() + absl::Seconds(20)).ok());
    sequences.push_back({Key(absl::StrCat("s", r)), kTokens});
  }
  auto replay = FetchReplayRoutes(*stub_, sequences,
                                  {.moe_layers = shape_.layers, .top_k = 2, .num_experts = 16});
  ASSERT_TRUE(replay.ok()) << replay.status();
  EXPECT_EQ(replay->missing_entries, 0);
  for (int r = 0; r < kRecords; ++r) {
    EXPECT_EQ(replay->statuses[r], routerreplay::v1::RECORD_STATUS_COMPLETE);
    const int16_t* got = replay->routes.data() + r * kTokens * shape_.ids_per_row();
    EXPECT_EQ(std::vector<int16_t>(got, got + (kTokens - 1) * shape_.ids_per_row()), routes[r]);
    EXPECT_EQ(got[(kTokens - 1) * shape_.ids_per_row()], -1);  // The last token has no row.
  }
}

TEST_F(RouterReplayServiceTest, EngineCapturedRoutesReplayExactlyThroughTheService) {
  engine::ModelConfig config = engine::DefaultModelConfig();
  auto model = engine::BaseModel::Create(config, 7);
  ASSERT_TRUE(model.ok());
  engine::Transformer transformer(*model, nullptr,
                                  std::make_unique<engine::CpuModelOps>(model->config()));
  std::vector<engine::GenerationRequest> requests;
  for (int s = 0; s < 4; ++s) {
    requests.push_back({.prompt = {1, 5 + s, 9, 12}, .max_new_tokens = 8, .seed = uint64_t(s)});
  }
  auto samples = engine::Generate(transformer, requests);
  ASSERT_TRUE(samples.ok()) << samples.status();
  shape_ = {
      .layers = config.MoeLayerIndices(), .top_k = config.top_k, .num_experts = config.num_experts};
  ASSERT_EQ(shape_.layers.front(), config.num_dense_layers);  // Global indices, dense skipped.

  RouteAppender appender(*channel_);
  std::vector<ReplaySequence> sequences;
  engine::TokenBatch batch;
  for (int s = 0; s < 4; ++s) {
    const engine::GeneratedSample& sample = (*samples)[s];
    const int64_t rows = static_cast<int64_t>(sample.tokens.size()) - 1;
    ASSERT_EQ(static_cast<int64_t>(sample.routes.size()), rows * shape_.ids_per_row());
    ASSERT_TRUE(appender
                    .Append(Key(absl::StrCat("g", s)), shape_, 0, rows, sample.routes.data(),
                            /*seal=*/true)
                    .ok());
    sequences.push_back({Key(absl::StrCat("g", s)), rows + 1});
    batch.Add(sample.tokens);
  }
  ASSERT_TRUE(appender.Flush(absl::Now() + absl::Seconds(20)).ok());
  auto replay = FetchReplayRoutes(
      *stub_, sequences,
      {.moe_layers = shape_.layers, .top_k = config.top_k, .num_experts = config.num_experts});
  ASSERT_TRUE(replay.ok()) << replay.status();

  auto live = transformer.Forward(batch);
  ASSERT_TRUE(live.ok());
  const std::vector<float> live_logits(*live, *live + batch.num_tokens() * config.vocab_size);
  auto replayed = transformer.Forward(batch, &replay->routes);
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  EXPECT_EQ(transformer.routing_stats().differing_decisions, 0);
  EXPECT_EQ(transformer.routing_stats().live_fallbacks,
            batch.num_sequences() * static_cast<int64_t>(shape_.layers.size()));
  EXPECT_EQ(std::vector<float>(*replayed, *replayed + live_logits.size()), live_logits);
}

TEST_F(RouterReplayServiceTest, AppenderReportsTheRecordThatFailedAndKeepsTheOthers) {
  RouteAppender appender(*channel_);
  const std::vector<int16_t> rows = SyntheticRoutes(shape_, 6, 20);
  const std::vector<int16_t> other = SyntheticRoutes(shape_, 6, 21);
  ASSERT_TRUE(appender.Append(Key("bad"), shape_, 0, 6, rows.data(), /*seal=*/false).ok());
  ASSERT_TRUE(appender.Flush(absl::Now() + absl::Seconds(20)).ok());
  ASSERT_TRUE(appender.Append(Key("good"), shape_, 0, 6, rows.data(), true).ok());
  ASSERT_TRUE(appender.Append(Key("bad"), shape_, 0, 6, other.data(), true).ok());  // Conflicts.
  EXPECT_TRUE(appender.WaitForRecord(Key("good"), absl::Now() + absl::Seconds(20)).ok());
  const absl::Status failed = appender.WaitForRecord(Key("bad"), absl::Now() + absl::Seconds(20));
  EXPECT_EQ(failed.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(failed.message(), HasSubstr("differs from stored rows at row 0"));
  EXPECT_EQ(appender.Append(Key("bad"), shape_, 6, 1, rows.data(), /*seal=*/false).code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(appender.Flush(absl::Now() + absl::Seconds(20)).code(), absl::StatusCode::kAborted);
}

// A TCP port that accepts connections into its backlog but never answers: a hung peer.
class SilentListener {
 public:
  SilentListener() : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    listen(fd_, 16);
    socklen_t length = sizeof(address);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
  }
  ~SilentListener() { close(fd_); }
  int port() const { return port_; }

 private:
  int fd_;
  int port_ = 0;
};

TEST(RouteAppenderTest, AHungServiceFailsRecordsAndAFullBufferPushesBack) {
  SilentListener hung;
  auto channel = *CreateChannel({.target = absl::StrCat("127.0.0.1:", hung.port()),
                                 .service_name = "tandem.routerreplay.v1.RouterReplayService"});
  RouteAppender appender(channel, {.max_buffered_bytes = 1000,
                                   .max_block = absl::Milliseconds(50),
                                   .rpc_timeout = absl::Milliseconds(500),
                                   .max_attempts = 2,
                                   .initial_backoff = absl::Milliseconds(10)});
  const RouteShape shape{.layers = {0}, .top_k = 3, .num_experts = 8};
  const std::vector<int16_t> rows = SyntheticRoutes(shape, 100, 1);  // 600 bytes.
  const RecordKey key{.job_id = "j", .policy_version = 1, .sample_id = "s"};
  ASSERT_TRUE(appender.Append(key, shape, 0, 100, rows.data(), /*seal=*/false).ok());
  const absl::Status full = appender.Append(key, shape, 100, 100, rows.data(), /*seal=*/false);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(), HasSubstr("route buffer full"));
  const absl::Status failed = appender.WaitForRecord(key, absl::Now() + absl::Seconds(30));
  EXPECT_TRUE(absl::IsDeadlineExceeded(failed) || absl::IsUnavailable(failed)) << failed;
  EXPECT_EQ(appender.buffered_bytes(), 0);
  EXPECT_EQ(appender.Append({.job_id = "bad id"}, shape, 0, 1, rows.data(), /*seal=*/false).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(RouterReplayServiceTest, InvalidChunksGetClearStatusesAndTouchNoOtherRecord) {
  std::vector<int16_t> rows = SyntheticRoutes(shape_, 10, 1);
  routerreplay::v1::AppendRequest good = Chunk(Key("good"), rows, 0, 10);

  std::vector<int16_t> duplicate = rows;
  duplicate[1 * shape_.ids_per_row() + 2 * 1 + 1] = duplicate[1 * shape_.ids_per_row() + 2 * 1];
  grpc::Status status = Append({good, Chunk(Key("bad"), duplicate, 0, 10)});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("bad#0 row 1 layer 3: duplicate expert"));

  std::vector<int16_t> out_of_range = rows;
  out_of_range[5] = 16;
  EXPECT_THAT(Append({Chunk(Key("bad"), out_of_range, 0, 10)}).error_message(),
              HasSubstr("expert 16 out of range [0, 16)"));

  routerreplay::v1::AppendRequest short_rows = Chunk(Key("bad"), rows, 0, 10);
  short_rows.mutable_rows()->resize(10);
  EXPECT_THAT(Append({short_rows}).error_message(), HasSubstr("rows has 10 bytes; expected"));

  routerreplay::v1::AppendRequest no_layers = Chunk(Key("bad"), rows, 0, 10);
  no_layers.clear_moe_layer_indices();
  EXPECT_EQ(Append({no_layers}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  routerreplay::v1::AppendRequest bad_key = good;
  bad_key.mutable_key()->set_sample_id("with space");
  EXPECT_THAT(Append({bad_key}).error_message(), HasSubstr("bad sample_id: 'with space'"));

  // An oversized chunk: 1 layer × top-1, 2^21 + 1 rows of 2 bytes.
  shape_ = {.layers = {0}, .top_k = 1, .num_experts = 4};
  const std::vector<int16_t> huge((int64_t{1} << 21) + 1, 0);
  status = Append({Chunk(Key("huge"), huge, 0, static_cast<int64_t>(huge.size()))});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("exceeds the 4 MiB limit"));
  shape_ = {.layers = {1, 3, 4}, .top_k = 2, .num_experts = 16};

  // The good record of the failed stream is intact, the bad one absent.
  std::vector<routerreplay::v1::FetchRoutesResponse> messages;
  ASSERT_EQ(Fetch(Named({Key("good")}), &messages).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);  // Stored, not sealed.
  routerreplay::v1::FetchRoutesRequest partial = Named({Key("good"), Key("bad")});
  partial.set_allow_partial(true);
  ASSERT_TRUE(Fetch(partial, &messages).ok());
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_EQ(messages[0].stored_rows(), 10);
  EXPECT_EQ(messages[1].status(), routerreplay::v1::RECORD_STATUS_MISSING);
}

TEST_F(RouterReplayServiceTest, RetriesAreSafeAndConflictsGapsAndHeaderChangesAreRefused) {
  const std::vector<int16_t> rows = SyntheticRoutes(shape_, 30, 2);
  routerreplay::v1::AppendResponse response;
  ASSERT_TRUE(Append({Chunk(Key("s"), rows, 0, 20), Chunk(Key("s"), rows, 0, 20)}, &response).ok());
  ASSERT_EQ(response.records_size(), 1);
  EXPECT_EQ(response.records(0).acknowledged_rows(), 20);
  EXPECT_FALSE(response.records(0).sealed());

  // Multi-turn continuation re-sending part of the prefix, then sealing.
  ASSERT_TRUE(Append({Chunk(Key("s"), rows, 15, 15, /*seal=*/true)}, &response).ok());
  EXPECT_EQ(response.records(0).acknowledged_rows(), 30);
  EXPECT_TRUE(response.records(0).sealed());

  std::vector<int16_t> changed = rows;
  changed[25 * shape_.ids_per_row() + 5] = changed[25 * shape_.ids_per_row() + 5] == 0 ? 1 : 0;
  if (changed[25 * shape_.ids_per_row() + 5] == changed[25 * shape_.ids_per_row() + 4]) {
    changed[25 * shape_.ids_per_row() + 5] = 2;
  }
  grpc::Status conflict = Append({Chunk(Key("s"), changed, 20, 10, true)});
  EXPECT_EQ(conflict.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(conflict.error_message(),
              HasSubstr("differs from stored rows at row 25, layer 4, slot 1"));

  ASSERT_TRUE(Append({Chunk(Key("t"), rows, 0, 5)}).ok());
  grpc::Status gap = Append({Chunk(Key("t"), rows, 8, 2)});
  EXPECT_EQ(gap.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(gap.error_message(), HasSubstr("has 5 rows, chunk starts at 8"));
  routerreplay::v1::AppendRequest other_k = Chunk(Key("t"), rows, 5, 1);
  other_k.set_num_experts(32);
  EXPECT_EQ(Append({other_k}).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  // Re-appending inside a sealed record is a retry: fine.
  EXPECT_TRUE(Append({Chunk(Key("s"), rows, 29, 1), Chunk(Key("s"), rows, 0, 1)}).ok());
  std::vector<int16_t> longer = SyntheticRoutes(shape_, 31, 2);
  std::copy(rows.begin(), rows.end(), longer.begin());
  EXPECT_THAT(Append({Chunk(Key("s"), longer, 30, 1)}).error_message(),
              HasSubstr("sealed at 30 rows"));
}

TEST_F(RouterReplayServiceTest, SealChecksTotalsAndIsIdempotent) {
  const std::vector<int16_t> rows = SyntheticRoutes(shape_, 12, 3);
  Store(Key("s"), rows, /*seal=*/false);
  const auto seal = [&](const RecordKey& key, int64_t total) {
    routerreplay::v1::SealRequest request;
    *request.mutable_key() = ToProto(key);
    request.set_total_rows(total);
    routerreplay::v1::SealResponse response;
    grpc::ClientContext context;
    SetTimeout(context, absl::Seconds(10));
    return stub_->Seal(&context, request, &response);
  };
  EXPECT_THAT(seal(Key("s"), 13).error_message(), HasSubstr("has 12 rows, seal says 13"));
  EXPECT_EQ(seal(Key("s"), 0).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(seal(Key("absent"), 3).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(seal(Key("s"), 12).ok());
  EXPECT_TRUE(seal(Key("s"), 12).ok());
  EXPECT_EQ(seal(Key("s"), 11).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(RouterReplayServiceTest, FetchChecksSelectionsBeforeSendingAndServesPartialsOnRequest) {
  const std::vector<int16_t> rows = SyntheticRoutes(shape_, 40, 4);
  Store(Key("sealed"), rows);
  Store(Key("open"), rows, /*seal=*/false);
  std::vector<routerreplay::v1::FetchRoutesResponse> messages;
  grpc::Status status = Fetch(Named({Key("sealed"), Key("absent")}), &messages);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("absent#0 not found"));
  EXPECT_TRUE(messages.empty());  // Checked before any data is sent.
  status = Fetch(Named({Key("open")}), &messages);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("open#0 not sealed (40 rows)"));

  routerreplay::v1::FetchRoutesRequest partial = Named({Key("open"), Key("absent")});
  partial.set_allow_partial(true);
  routerreplay::v1::RowRange& range =
      *partial.mutable_records()->mutable_records(0)->add_row_ranges();
  range.set_begin(38);
  range.set_end(42);
  ASSERT_TRUE(Fetch(partial, &messages).ok());
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_EQ(messages[0].status(), routerreplay::v1::RECORD_STATUS_PARTIAL);
  std::vector<int16_t> expected(rows.begin() + 38 * 6, rows.end());
  expected.resize(4 * 6, -1);
  EXPECT_EQ(RowsOf({messages[0]}), expected);
  EXPECT_EQ(messages[1].status(), routerreplay::v1::RECORD_STATUS_MISSING);
  EXPECT_EQ(messages[1].num_rows(), 0);

  routerreplay::v1::FetchRoutesRequest past_end = Named({Key("sealed")});
  *past_end.mutable_records()->mutable_records(0)->add_row_ranges() = range;
  EXPECT_EQ(Fetch(past_end, &messages).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  routerreplay::v1::FetchRoutesRequest dense_layer = Named({Key("sealed")});
  dense_layer.add_layers(2);
  EXPECT_THAT(Fetch(dense_layer, &messages).error_message(),
              HasSubstr("layer 2 is not a MoE layer of record"));
  EXPECT_EQ(Fetch(routerreplay::v1::FetchRoutesRequest(), &messages).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  routerreplay::v1::FetchRoutesRequest bad_rank = Named({Key("sealed")});
  bad_rank.set_dp_rank(2);
  bad_rank.set_dp_size(2);
  EXPECT_EQ(Fetch(bad_rank, &messages).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  routerreplay::v1::FetchRoutesRequest tiny_chunks = Named({Key("sealed")});
  tiny_chunks.set_max_chunk_bytes(1000);
  EXPECT_EQ(Fetch(tiny_chunks, &messages).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  routerreplay::v1::FetchRoutesRequest twice = Named({Key("sealed")});
  twice.add_layers(3);
  twice.add_layers(3);
  EXPECT_THAT(Fetch(twice, &messages).error_message(), HasSubstr("layer 3 named twice"));
  // Rows past an unsealed record's end come back as -1, but not without bound (two ranges of
  // 2^63 rows once overflowed the row count and aborted the server).
  routerreplay::v1::FetchRoutesRequest endless = Named({Key("open")});
  endless.set_allow_partial(true);
  for (int i = 0; i < 2; ++i) {
    routerreplay::v1::RowRange& huge =
        *endless.mutable_records()->mutable_records(0)->add_row_ranges();
    huge.set_begin(0);
    huge.set_end(std::numeric_limits<int64_t>::max());
  }
  status = Fetch(endless, &messages);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("more than 2^31 rows"));
}

TEST_F(RouterReplayServiceTest, FetchSelectsLayersAndRangesInRequestOrderAndSplitsLargeRecords) {
  const std::vector<int16_t> rows = SyntheticRoutes(shape_, 20, 5);
  Store(Key("s"), rows);
  routerreplay::v1::FetchRoutesRequest request = Named({Key("s")});
  request.add_layers(4);
  request.add_layers(1);
  for (auto [begin, end] : {std::pair{10, 12}, std::pair{2, 3}}) {
    routerreplay::v1::RowRange& range =
        *request.mutable_records()->mutable_records(0)->add_row_ranges();
    range.set_begin(begin);
    range.set_end(end);
  }
  std::vector<routerreplay::v1::FetchRoutesResponse> messages;
  ASSERT_TRUE(Fetch(request, &messages).ok());
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_THAT(messages[0].layer_indices(), ::testing::ElementsAre(4, 1));
  std::vector<int16_t> expected;
  for (int row : {10, 11, 2}) {
    for (int layer : {2, 0}) {
      for (int s = 0; s < 2; ++s) expected.push_back(rows[row * 6 + layer * 2 + s]);
    }
  }
  EXPECT_EQ(RowsOf(messages), expected);

  // A record larger than max_chunk_bytes arrives in consecutive messages, whose rows leave
  // 16 KiB of each for the other fields.
  shape_ = {.layers = {3, 4, 5, 6, 7, 8, 9, 10}, .top_k = 8, .num_experts = 256};
  const std::vector<int16_t> big = SyntheticRoutes(shape_, 2000, 6);  // 256,000 bytes.
  Store(Key("big"), big);
  routerreplay::v1::FetchRoutesRequest split = Named({Key("big")});
  split.set_max_chunk_bytes(64 << 10);
  messages.clear();
  ASSERT_TRUE(Fetch(split, &messages).ok());
  EXPECT_EQ(messages.size(), 6u);  // 384 rows of 128 bytes each, 48 KiB.
  for (const routerreplay::v1::FetchRoutesResponse& message : messages) {
    EXPECT_LE(message.ByteSizeLong(), size_t{64} << 10);
  }
  EXPECT_EQ(messages.back().row_offset() + messages.back().num_rows(), 2000);
  EXPECT_EQ(RowsOf(messages), big);
}

TEST_F(RouterReplayServiceTest, RowRangesOfAMissingRecordAreCheckedToo) {
  routerreplay::v1::FetchRoutesRequest request = Named({Key("never-stored")});
  request.set_allow_partial(true);
  routerreplay::v1::RowRange& range =
      *request.mutable_records()->mutable_records(0)->add_row_ranges();
  range.set_begin(5);
  range.set_end(2);
  std::vector<routerreplay::v1::FetchRoutesResponse> messages;
  const grpc::Status status = Fetch(request, &messages);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("bad row range [5, 2)"));
}

TEST_F(RouterReplayServiceTest, JobSelectionTakesTheLatestAttemptAndShardsEverySampleOnce) {
  const std::vector<int16_t> rows = SyntheticRoutes(shape_, 3, 7);
  for (int s = 0; s < 60; ++s) Store(Key(absl::StrCat("p", s / 4, "/", s % 4), 1 + s % 3), rows);
  Store(Key("p0/0", 1, 1), SyntheticRoutes(shape_, 5, 8));  // A retried sample.
  Store(Key("unsealed", 1), rows, /*seal=*/false);

  routerreplay::v1::FetchRoutesRequest request;
  request.mutable_job()->set_job_id(Job());
  std::vector<routerreplay::v1::FetchRoutesResponse> messages;
  ASSERT_TRUE(Fetch(request, &messages).ok());
  ASSERT_EQ(messages.size(), 60u);
  EXPECT_EQ(messages[0].key().sample_id(), "p0/0");
  EXPECT_EQ(messages[0].key().attempt(), 1);
  EXPECT_EQ(messages[0].stored_rows(), 5);

  // A retry still in progress supersedes the sealed attempt before it: that one was abandoned.
  Store(Key("p0/3", 1, 1), rows, /*seal=*/false);
  messages.clear();
  ASSERT_TRUE(Fetch(request, &messages).ok());
  EXPECT_EQ(messages.size(), 59u);
  for (const auto& message : messages) EXPECT_NE(message.key().sample_id(), "p0/3");

  request.mutable_job()->set_all_attempts(true);
  request.set_allow_partial(true);
  messages.clear();
  ASSERT_TRUE(Fetch(request, &messages).ok());
  EXPECT_EQ(messages.size(), 63u);

  request.mutable_job()->mutable_versions()->set_begin(2);
  request.mutable_job()->mutable_versions()->set_end(3);
  messages.clear();
  ASSERT_TRUE(Fetch(request, &messages).ok());
  EXPECT_EQ(messages.size(), 20u);

  // Three data-parallel ranks together see every sample exactly once.
  request.mutable_job()->clear_versions();
  request.mutable_job()->set_all_attempts(false);
  request.set_allow_partial(false);
  std::multiset<std::string> seen;
  for (int rank = 0; rank < 3; ++rank) {
    request.set_dp_rank(rank);
    request.set_dp_size(3);
    messages.clear();
    ASSERT_TRUE(Fetch(request, &messages).ok());
    EXPECT_GT(messages.size(), 5u);
    for (const auto& message : messages) {
      seen.insert(ToString(FromProto(message.key())));
      EXPECT_EQ(DataParallelRank(message.key().sample_id(), 3), rank);
    }
  }
  // Every sealed sample but p0/3, whose newest attempt is still open.
  EXPECT_EQ(seen.size(), 59u);
  EXPECT_EQ(std::set<std::string>(seen.begin(), seen.end()).size(), 59u);
}

TEST_F(RouterReplayServiceTest, ExpertLoadCountsEveryChoicePerLayerAndGroup) {
  std::vector<int16_t> a = SyntheticRoutes(shape_, 50, 9, 1.0, /*missing_every=*/10);
  std::vector<int16_t> b = SyntheticRoutes(shape_, 30, 10);
  Store(Key("a"), a);
  Store(Key("b"), b);
  const auto count = [&](const std::vector<int16_t>& rows, int layer_position, int expert) {
    int64_t n = 0;
    for (size_t row = 0; row < rows.size() / 6; ++row) {
      for (int s = 0; s < 2; ++s) n += rows[row * 6 + layer_position * 2 + s] == expert;
    }
    return n;
  };
  routerreplay::v1::GetExpertLoadRequest request;
  request.set_job_id(Job());
  routerreplay::v1::GetExpertLoadResponse response;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->GetExpertLoad(&context, request, &response).ok());
  }
  EXPECT_THAT(response.layer_indices(), ::testing::ElementsAre(1, 3, 4));
  ASSERT_EQ(response.loads_size(), 1);
  EXPECT_EQ(response.loads(0).rows(), 80);
  EXPECT_EQ(response.loads(0).missing(), 5);
  for (int l = 0; l < 3; ++l) {
    for (int e = 0; e < 16; ++e) {
      EXPECT_EQ(response.loads(0).counts(l * 16 + e), count(a, l, e) + count(b, l, e));
    }
  }
  request.add_layers(3);
  *request.add_groups()->add_keys() = ToProto(Key("b"));
  *request.add_groups()->add_keys() = ToProto(Key("a"));
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->GetExpertLoad(&context, request, &response).ok());
  }
  ASSERT_EQ(response.loads_size(), 2);
  EXPECT_EQ(response.loads(0).counts(7), count(b, 1, 7));
  EXPECT_EQ(response.loads(1).counts(7), count(a, 1, 7));
  request.set_layers(0, 2);
  {
    grpc::ClientContext context;
    EXPECT_EQ(stub_->GetExpertLoad(&context, request, &response).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  // A layer named twice, and responses too large to send (groups x layers x experts counts,
  // which once overflowed an int and wrote past the counts), are refused.
  request.set_layers(0, 3);
  request.add_layers(3);
  {
    grpc::ClientContext context;
    const grpc::Status status = stub_->GetExpertLoad(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("layer 3 named twice"));
  }
  shape_.num_experts = 1024;
  Store(Key("wide"), SyntheticRoutes(shape_, 4, 7));
  request.clear_layers();
  request.clear_groups();
  for (int g = 0; g < 4096; ++g) *request.add_groups()->add_keys() = ToProto(Key("wide"));
  {
    grpc::ClientContext context;
    const grpc::Status status = stub_->GetExpertLoad(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("4096 groups x 3 layers x 1024 experts"));
  }
}

TEST_F(RouterReplayServiceTest, PlacementReproducesTheEplbReferenceAndPlansFromRecordedLoads) {
  routerreplay::v1::PlanPlacementRequest request;
  routerreplay::v1::LoadMatrix& load = *request.mutable_load();
  load.set_num_layers(2);
  load.set_num_experts(12);
  for (double w : {90, 132, 40,  61, 104, 165, 39,  4,   73,  56, 183, 86,
                   20, 107, 104, 64, 19,  197, 187, 157, 172, 86, 16,  27}) {
    load.add_load(w);
  }
  request.set_num_replicas(16);
  request.set_num_groups(4);
  request.set_num_nodes(2);
  request.set_num_gpus(8);
  routerreplay::v1::PlanPlacementResponse response;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->PlanPlacement(&context, request, &response).ok());
  }
  EXPECT_THAT(response.phy2log(),
              ::testing::ElementsAre(5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1, 7, 10, 6, 8,
                                     6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1));
  EXPECT_NEAR(response.balancedness_after(0), 0.828, 1e-3);
  EXPECT_NEAR(response.balancedness_after(1), 0.805, 1e-3);

  shape_ = {.layers = {1, 3}, .top_k = 2, .num_experts = 8};
  Store(Key("s"), SyntheticRoutes(shape_, 200, 11, 1.5));
  routerreplay::v1::PlanPlacementRequest from_job;
  from_job.mutable_job()->set_job_id(Job());
  from_job.set_num_replicas(12);
  from_job.set_num_groups(2);
  from_job.set_num_nodes(2);
  from_job.set_num_gpus(4);
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->PlanPlacement(&context, from_job, &response).ok());
  }
  EXPECT_THAT(response.layer_indices(), ::testing::ElementsAre(1, 3));
  for (int l = 0; l < 2; ++l) {
    EXPECT_GE(response.balancedness_after(l), response.balancedness_before(l));
  }
  from_job.set_num_replicas(6);  // Fewer slots than experts.
  grpc::ClientContext context;
  EXPECT_EQ(stub_->PlanPlacement(&context, from_job, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(RouterReplayServiceTest, PlanBalanceEvensAStepAndRefusesBadFieldsByName) {
  // Two micro-batches of 8 experts on 4 ranks (2 nodes): expert 0 hot in the first, 5 in the
  // second.
  routerreplay::v1::PlanBalanceRequest request;
  request.set_micro_batches(2);
  request.set_num_experts(8);
  for (int64_t t : {900, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 900, 20, 20}) {
    request.add_tokens(t);
  }
  request.set_ranks(4);
  request.set_ranks_per_node(2);
  for (int e = 0; e < 8; ++e) request.add_current_home(e / 2);
  routerreplay::v1::PlanBalanceResponse response;
  {
    grpc::ClientContext context;
    const grpc::Status status = stub_->PlanBalance(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  ASSERT_EQ(response.home_size(), 8);
  ASSERT_EQ(response.micro_batches_size(), 2);
  for (const routerreplay::v1::PlanBalanceResponse::MicroBatch& batch : response.micro_batches()) {
    EXPECT_LT(batch.imbalance_after(), batch.imbalance_before());
    EXPECT_FALSE(batch.copies().empty()) << "the hot expert is split";
    int64_t tokens = 0;
    for (const int64_t t : batch.rank_tokens()) tokens += t;
    EXPECT_EQ(tokens, 1040);
  }

  const auto refused = [&](const std::function<void(routerreplay::v1::PlanBalanceRequest&)>& edit,
                           const std::string& field) {
    routerreplay::v1::PlanBalanceRequest bad = request;
    edit(bad);
    grpc::ClientContext context;
    routerreplay::v1::PlanBalanceResponse ignored;
    const grpc::Status status = stub_->PlanBalance(&context, bad, &ignored);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field;
    EXPECT_THAT(status.error_message(), HasSubstr(field));
  };
  refused([](routerreplay::v1::PlanBalanceRequest& r) { r.add_tokens(1); }, "tokens");
  refused([](routerreplay::v1::PlanBalanceRequest& r) { r.set_tokens(3, -1); }, "each >= 0");
  refused(
      [](routerreplay::v1::PlanBalanceRequest& r) {
        r.set_ranks(3);
        r.set_ranks_per_node(1);
      },
      "cannot be spread evenly");
  refused([](routerreplay::v1::PlanBalanceRequest& r) { r.set_ranks_per_node(3); },
          "ranks_per_node");
  refused([](routerreplay::v1::PlanBalanceRequest& r) { r.set_current_home(0, 1); },
          "current placement");
  refused([](routerreplay::v1::PlanBalanceRequest& r) { r.set_replica_slots_per_rank(-1); },
          "replica_slots_per_rank");
  refused([](routerreplay::v1::PlanBalanceRequest& r) { r.set_move_cost_tokens(-1); },
          "move_cost_tokens");
  refused([](routerreplay::v1::PlanBalanceRequest& r) { r.set_micro_batches(1 << 20); }, "at most");
}

TEST_F(RouterReplayServiceTest, DeleteRecordsByVersionRangeAndMetricsReflectTheWork) {
  const std::vector<int16_t> rows = SyntheticRoutes(shape_, 8, 12);
  for (int version = 1; version <= 4; ++version) Store(Key("s", version), rows);
  routerreplay::v1::DeleteRecordsRequest request;
  request.set_job_id(Job());
  request.mutable_versions()->set_begin(2);
  request.mutable_versions()->set_end(4);
  routerreplay::v1::DeleteRecordsResponse response;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->DeleteRecords(&context, request, &response).ok());
  }
  EXPECT_EQ(response.records_deleted(), 2);
  EXPECT_GT(response.bytes_freed(), 0);
  std::vector<routerreplay::v1::FetchRoutesResponse> messages;
  EXPECT_EQ(Fetch(Named({Key("s", 2)}), &messages).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(Fetch(Named({Key("s", 4)}), &messages).ok());
  request.mutable_versions()->set_end(1);
  grpc::ClientContext context;
  EXPECT_EQ(stub_->DeleteRecords(&context, request, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  auto page = tandem::testing::HttpGet(
      absl::StrCat("http://127.0.0.1:", server_->metrics_port(), "/metrics"));
  ASSERT_TRUE(page.ok()) << page.status();
  for (const char* series :
       {"tandem_router_replay_appended_tokens_total", "tandem_router_replay_appended_bytes_total",
        "tandem_router_replay_stored_bytes_total{encoding=\"packed\"}",
        "tandem_router_replay_compression_ratio", "tandem_router_replay_fetched_bytes_total",
        "tandem_router_replay_records{state=\"sealed\"}",
        "tandem_router_replay_sync_seconds_bucket",
        "tandem_router_replay_deleted_records_total{reason=\"request\"}"}) {
    EXPECT_THAT(*page, HasSubstr(series));
  }
}

// Every documented rule of every RPC, as a client built from the protos sees it: INVALID_ARGUMENT
// whose details name the field by its path from the request root (with list indices) and give
// the ErrorInfo reason.
TEST_F(RouterReplayServiceTest, EveryRuleNamesTheFieldPathAndReasonInItsDetails) {
  Store(Key("sealed"), SyntheticRoutes(shape_, 10, 21));  // Layers 1, 3, 4; 10 rows.
  const RouteShape wide{.layers = {1, 3, 4}, .top_k = 2, .num_experts = 1024};
  {
    const std::vector<int16_t> rows = SyntheticRoutes(wide, 2, 22);
    ASSERT_TRUE(Append({AppendRequestFor(Key("wide"), wide, 0, 2, rows.data(), true)}).ok());
  }
  const std::vector<int16_t> rows = SyntheticRoutes(shape_, 4, 23);
  const routerreplay::v1::AppendRequest chunk = Chunk(Key("new"), rows, 0, 4);
  const auto append = [&](const std::function<void(routerreplay::v1::AppendRequest&)>& edit) {
    return [this, chunk, edit] {
      routerreplay::v1::AppendRequest bad = chunk;
      edit(bad);
      return Append({bad});
    };
  };
  const auto seal = [&](const std::function<void(routerreplay::v1::SealRequest&)>& edit) {
    return [this, edit] {
      routerreplay::v1::SealRequest request;
      *request.mutable_key() = ToProto(Key("sealed"));
      request.set_total_rows(10);
      edit(request);
      grpc::ClientContext context;
      routerreplay::v1::SealResponse response;
      return stub_->Seal(&context, request, &response);
    };
  };
  const auto fetch = [&](const std::function<void(routerreplay::v1::FetchRoutesRequest&)>& edit) {
    return [this, edit] {
      routerreplay::v1::FetchRoutesRequest request = Named({Key("sealed")});
      edit(request);
      std::vector<routerreplay::v1::FetchRoutesResponse> messages;
      return Fetch(request, &messages);
    };
  };
  const auto load = [&](const std::function<void(routerreplay::v1::GetExpertLoadRequest&)>& edit) {
    return [this, edit] {
      routerreplay::v1::GetExpertLoadRequest request;
      request.set_job_id(Job());
      edit(request);
      grpc::ClientContext context;
      routerreplay::v1::GetExpertLoadResponse response;
      return stub_->GetExpertLoad(&context, request, &response);
    };
  };
  const auto placement =
      [&](const std::function<void(routerreplay::v1::PlanPlacementRequest&)>& edit) {
        return [this, edit] {
          routerreplay::v1::PlanPlacementRequest request;
          request.mutable_load()->set_num_layers(2);
          request.mutable_load()->set_num_experts(4);
          for (int i = 0; i < 8; ++i) request.mutable_load()->add_load(i + 1);
          request.set_num_replicas(8);
          request.set_num_groups(2);
          request.set_num_nodes(2);
          request.set_num_gpus(4);
          edit(request);
          grpc::ClientContext context;
          routerreplay::v1::PlanPlacementResponse response;
          return stub_->PlanPlacement(&context, request, &response);
        };
      };
  const auto balance = [&](const std::function<void(routerreplay::v1::PlanBalanceRequest&)>& edit) {
    return [this, edit] {
      routerreplay::v1::PlanBalanceRequest request;
      request.set_micro_batches(2);
      request.set_num_experts(8);
      for (int t = 0; t < 16; ++t) request.add_tokens(10 + t);
      request.set_ranks(4);
      request.set_ranks_per_node(2);
      for (int e = 0; e < 8; ++e) request.add_current_home(e / 2);
      edit(request);
      grpc::ClientContext context;
      routerreplay::v1::PlanBalanceResponse response;
      return stub_->PlanBalance(&context, request, &response);
    };
  };
  const auto remove =
      [&](const std::function<void(routerreplay::v1::DeleteRecordsRequest&)>& edit) {
        return [this, edit] {
          routerreplay::v1::DeleteRecordsRequest request;
          request.set_job_id("no-such-job");
          edit(request);
          grpc::ClientContext context;
          routerreplay::v1::DeleteRecordsResponse response;
          return stub_->DeleteRecords(&context, request, &response);
        };
      };
  using AppendRequest = routerreplay::v1::AppendRequest;
  using FetchRequest = routerreplay::v1::FetchRoutesRequest;
  using LoadRequest = routerreplay::v1::GetExpertLoadRequest;
  using PlacementRequest = routerreplay::v1::PlanPlacementRequest;
  using BalanceRequest = routerreplay::v1::PlanBalanceRequest;
  const std::vector<InvalidArgumentCase> cases = {
      // Append.
      {"AppendBadJobId", append([](AppendRequest& r) { r.mutable_key()->set_job_id("a b"); }),
       "key.job_id"},
      {"AppendMissingKey", append([](AppendRequest& r) { r.clear_key(); }), "key.job_id"},
      {"AppendBadSampleId", append([](AppendRequest& r) { r.mutable_key()->set_sample_id(""); }),
       "key.sample_id"},
      {"AppendNegativeVersion",
       append([](AppendRequest& r) { r.mutable_key()->set_policy_version(-1); }),
       "key.policy_version"},
      {"AppendNegativeAttempt", append([](AppendRequest& r) { r.mutable_key()->set_attempt(-1); }),
       "key.attempt"},
      {"AppendNoLayers", append([](AppendRequest& r) { r.clear_moe_layer_indices(); }),
       "moe_layer_indices"},
      {"AppendLayersNotIncreasing", append([](AppendRequest& r) { r.set_moe_layer_indices(2, 3); }),
       "moe_layer_indices[2]"},
      {"AppendNoTopK", append([](AppendRequest& r) { r.clear_top_k(); }), "top_k"},
      {"AppendFewerExpertsThanTopK", append([](AppendRequest& r) { r.set_num_experts(1); }),
       "num_experts"},
      {"AppendNoTokens", append([](AppendRequest& r) { r.clear_num_tokens(); }), "num_tokens"},
      {"AppendNegativeOffset", append([](AppendRequest& r) { r.set_token_offset(-1); }),
       "token_offset"},
      {"AppendRowsOfTheWrongSize", append([](AppendRequest& r) { r.mutable_rows()->resize(10); }),
       "rows"},
      {"AppendExpertOutOfRange",
       append([](AppendRequest& r) { (*r.mutable_rows())[0] = static_cast<char>(99); }), "rows"},
      // Seal.
      {"SealMissingKey", seal([](routerreplay::v1::SealRequest& r) { r.clear_key(); }),
       "key.job_id"},
      {"SealNoTotal", seal([](routerreplay::v1::SealRequest& r) { r.clear_total_rows(); }),
       "total_rows"},
      // FetchRoutes.
      {"FetchNoSelection", fetch([](FetchRequest& r) { r.clear_selection(); }), "selection"},
      {"FetchNoRecords", fetch([](FetchRequest& r) { r.mutable_records()->clear_records(); }),
       "records.records"},
      {"FetchBadKey", fetch([](FetchRequest& r) {
         *r.mutable_records()->add_records()->mutable_key() = ToProto(Key("with space"));
       }),
       "records.records[1].key.sample_id"},
      {"FetchNegativeRowBegin", fetch([](FetchRequest& r) {
         auto* ranges = r.mutable_records()->mutable_records(0);
         ranges->add_row_ranges()->set_end(2);
         ranges->add_row_ranges()->set_begin(-1);
       }),
       "records.records[0].row_ranges[1].begin"},
      {"FetchEmptyRowRange", fetch([](FetchRequest& r) {
         auto* range = r.mutable_records()->mutable_records(0)->add_row_ranges();
         range->set_begin(5);
         range->set_end(5);
       }),
       "records.records[0].row_ranges[0].end"},
      {"FetchTooManyRows", fetch([](FetchRequest& r) {
         auto* range = r.mutable_records()->mutable_records(0)->add_row_ranges();
         range->set_begin(0);
         range->set_end((int64_t{1} << 31) + 1);
       }),
       "records.records[0].row_ranges"},
      {"FetchRangePastASealedEnd", fetch([](FetchRequest& r) {
         auto* range = r.mutable_records()->mutable_records(0)->add_row_ranges();
         range->set_begin(0);
         range->set_end(11);
       }),
       "records.records[0].row_ranges[0].end"},
      {"FetchBadJobId", fetch([](FetchRequest& r) { r.mutable_job()->set_job_id("../x"); }),
       "job.job_id"},
      {"FetchNegativeVersion", fetch([](FetchRequest& r) {
         r.mutable_job()->set_job_id(Job());
         r.mutable_job()->mutable_versions()->set_begin(-1);
       }),
       "job.versions.begin"},
      {"FetchEmptyVersionRange", fetch([](FetchRequest& r) {
         r.mutable_job()->set_job_id(Job());
         r.mutable_job()->mutable_versions()->set_begin(3);
         r.mutable_job()->mutable_versions()->set_end(2);
       }),
       "job.versions.end"},
      {"FetchBadDpSize", fetch([](FetchRequest& r) { r.set_dp_size(-2); }), "dp_size"},
      {"FetchDpRankBeyondSize", fetch([](FetchRequest& r) {
         r.set_dp_rank(2);
         r.set_dp_size(2);
       }),
       "dp_rank"},
      {"FetchTinyChunks", fetch([](FetchRequest& r) { r.set_max_chunk_bytes(1000); }),
       "max_chunk_bytes"},
      {"FetchDenseLayer", fetch([](FetchRequest& r) {
         r.add_layers(1);
         r.add_layers(2);
       }),
       "layers[1]"},
      {"FetchLayerTwice", fetch([](FetchRequest& r) {
         r.add_layers(4);
         r.add_layers(4);
       }),
       "layers[1]"},
      // GetExpertLoad.
      {"LoadNoJobNoGroups", load([](LoadRequest& r) { r.clear_job_id(); }), "job_id"},
      {"LoadEmptyVersionRange", load([](LoadRequest& r) { r.mutable_versions()->set_end(-1); }),
       "versions.end"},
      {"LoadTooManyGroups", load([](LoadRequest& r) {
         for (int g = 0; g < 4097; ++g) r.add_groups();
       }),
       "groups"},
      {"LoadEmptyGroup", load([](LoadRequest& r) {
         *r.add_groups()->add_keys() = ToProto(Key("sealed"));
         r.add_groups();
       }),
       "groups[1].keys"},
      {"LoadBadKey", load([](LoadRequest& r) {
         routerreplay::v1::KeyGroup& group = *r.add_groups();
         *group.add_keys() = ToProto(Key("sealed"));
         *group.add_keys() = ToProto(Key("sealed", 1, -3));
       }),
       "groups[0].keys[1].attempt"},
      {"LoadDenseLayer", load([](LoadRequest& r) { r.add_layers(0); }), "layers[0]"},
      {"LoadLayerTwice", load([](LoadRequest& r) {
         r.add_layers(3);
         r.add_layers(3);
       }),
       "layers[1]"},
      {"LoadResponseTooLarge", load([](LoadRequest& r) {
         for (int g = 0; g < 400; ++g) *r.add_groups()->add_keys() = ToProto(Key("wide"));
       }),
       "", "RESPONSE_TOO_LARGE"},
      // PlanPlacement.
      {"PlacementNoSource", placement([](PlacementRequest& r) { r.clear_load(); }), "source"},
      {"PlacementNoLayers",
       placement([](PlacementRequest& r) { r.mutable_load()->set_num_layers(0); }),
       "load.num_layers"},
      {"PlacementNoExperts",
       placement([](PlacementRequest& r) { r.mutable_load()->set_num_experts(0); }),
       "load.num_experts"},
      {"PlacementLoadOfTheWrongSize",
       placement([](PlacementRequest& r) { r.mutable_load()->add_load(1); }), "load.load"},
      {"PlacementNegativeLoad",
       placement([](PlacementRequest& r) { r.mutable_load()->set_load(5, -1); }), "load.load[5]"},
      {"PlacementNoGpus", placement([](PlacementRequest& r) { r.clear_num_gpus(); }), "num_gpus"},
      {"PlacementNoNodes", placement([](PlacementRequest& r) { r.clear_num_nodes(); }),
       "num_nodes"},
      {"PlacementNoGroups", placement([](PlacementRequest& r) { r.clear_num_groups(); }),
       "num_groups"},
      {"PlacementNoReplicas", placement([](PlacementRequest& r) { r.clear_num_replicas(); }),
       "num_replicas"},
      {"PlacementReplicasNotPerGpu", placement([](PlacementRequest& r) { r.set_num_replicas(10); }),
       "num_replicas"},
      {"PlacementGpusNotPerNode", placement([](PlacementRequest& r) { r.set_num_nodes(3); }),
       "num_nodes"},
      {"PlacementExpertsNotPerGroup", placement([](PlacementRequest& r) { r.set_num_groups(3); }),
       "num_groups"},
      {"PlacementBadJobId", placement([](PlacementRequest& r) { r.mutable_job()->set_job_id(""); }),
       "job.job_id"},
      {"PlacementNegativeVersion", placement([](PlacementRequest& r) {
         r.mutable_job()->set_job_id(Job());
         r.mutable_job()->mutable_versions()->set_begin(-1);
       }),
       "job.versions.begin"},
      // PlanBalance.
      {"BalanceNoMicroBatches", balance([](BalanceRequest& r) { r.clear_micro_batches(); }),
       "micro_batches"},
      {"BalanceNoExperts", balance([](BalanceRequest& r) { r.clear_num_experts(); }),
       "num_experts"},
      {"BalanceTooManyEntries", balance([](BalanceRequest& r) { r.set_micro_batches(1 << 20); }),
       "tokens"},
      {"BalanceTokensOfTheWrongSize", balance([](BalanceRequest& r) { r.add_tokens(1); }),
       "tokens"},
      {"BalanceNegativeTokens", balance([](BalanceRequest& r) { r.set_tokens(3, -1); }),
       "tokens[3]"},
      {"BalanceNoRanks", balance([](BalanceRequest& r) { r.clear_ranks(); }), "ranks"},
      {"BalanceNoRanksPerNode", balance([](BalanceRequest& r) { r.clear_ranks_per_node(); }),
       "ranks_per_node"},
      {"BalanceRanksNotDividingExperts", balance([](BalanceRequest& r) {
         r.set_ranks(3);
         r.set_ranks_per_node(1);
       }),
       "ranks"},
      {"BalanceRanksPerNodeNotDividingRanks",
       balance([](BalanceRequest& r) { r.set_ranks_per_node(3); }), "ranks_per_node"},
      {"BalanceNegativeReplicaSlots",
       balance([](BalanceRequest& r) { r.set_replica_slots_per_rank(-1); }),
       "replica_slots_per_rank"},
      {"BalanceNegativeMoveCost", balance([](BalanceRequest& r) { r.set_move_cost_tokens(-1); }),
       "move_cost_tokens"},
      {"BalanceNoCurrentHome", balance([](BalanceRequest& r) { r.clear_current_home(); }),
       "current_home"},
      {"BalanceHomeOnNoRank", balance([](BalanceRequest& r) { r.set_current_home(0, 9); }),
       "current_home[0]"},
      // DeleteRecords.
      {"DeleteNoJobId", remove([](routerreplay::v1::DeleteRecordsRequest& r) { r.clear_job_id(); }),
       "job_id"},
      {"DeleteNegativeVersion", remove([](routerreplay::v1::DeleteRecordsRequest& r) {
         r.mutable_versions()->set_begin(-1);
       }),
       "versions.begin"},
      {"DeleteEmptyVersionRange", remove([](routerreplay::v1::DeleteRecordsRequest& r) {
         r.mutable_versions()->set_begin(4);
         r.mutable_versions()->set_end(1);
       }),
       "versions.end"},
  };
  ExpectEachRefusedWithDetails(cases);
}

TEST_F(RouterReplayServiceTest, HundredsOfExpertsRoundTripWithoutOverflow) {
  for (int experts : {256, 384, 600}) {
    shape_ = {.layers = {3, 5, 60}, .top_k = 8, .num_experts = experts};
    const std::vector<int16_t> rows = SyntheticRoutes(shape_, 100, experts, 1.0);
    Store(Key(absl::StrCat("e", experts)), rows);
    std::vector<routerreplay::v1::FetchRoutesResponse> messages;
    ASSERT_TRUE(Fetch(Named({Key(absl::StrCat("e", experts))}), &messages).ok());
    EXPECT_EQ(RowsOf(messages), rows) << experts;
    EXPECT_EQ(messages[0].num_experts(), experts);
  }
}

// Runs a hook once per FetchRoutes call, when its first message arrives and before the caller
// sees it: a fixed point in the middle of a fetch.
class AfterFirstFetchMessage final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit AfterFirstFetchMessage(std::function<void()> hook) : hook_(std::move(hook)) {}

  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* info) override {
    if (absl::string_view(info->method()) !=
        "/tandem.routerreplay.v1.RouterReplayService/FetchRoutes") {
      return nullptr;
    }
    return new Hook(hook_);
  }

 private:
  class Hook final : public grpc::experimental::Interceptor {
   public:
    explicit Hook(const std::function<void()>& hook) : hook_(hook) {}
    void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
      if (!fired_ &&
          methods->QueryInterceptionHookPoint(
              grpc::experimental::InterceptionHookPoints::POST_RECV_MESSAGE) &&
          methods->GetRecvMessage() != nullptr) {
        fired_ = true;
        hook_();
      }
      methods->Proceed();
    }

   private:
    const std::function<void()>& hook_;
    bool fired_ = false;
  };

  std::function<void()> hook_;
};

// A router-replay holding one record of ~17 MiB as fetched (DeepSeek-V3-like): far more than a
// stream's flow-control window, so a client that stops reading keeps its stream open.
class FetchStreamsTest : public ::testing::Test {
 protected:
  struct Stream {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReaderInterface<routerreplay::v1::FetchRoutesResponse>> reader;
  };

  void Start(RouterReplayOptions options) {
    options.store.path = ::testing::TempDir() + "/router_replay_streams";
    std::filesystem::remove_all(options.store.path);
    auto service = RouterReplayServiceImpl::Create(options);
    ASSERT_TRUE(service.ok()) << service.status();
    auto server = tandem::testing::StartLoopbackServer(
        "router-replay", {"tandem.routerreplay.v1.RouterReplayService", *std::move(service)});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    std::iota(layered_.layers.begin(), layered_.layers.end(), 3);  // Layers 0..2 dense.
    RouteAppender appender(server_.Channel());
    constexpr int kChunk = 2000;
    rows_ = SyntheticRoutes(layered_, kRows, 1);
    for (int first = 0; first < kRows; first += kChunk) {
      ASSERT_TRUE(appender
                      .Append(key_, layered_, first, kChunk,
                              rows_.data() + int64_t{first} * layered_.ids_per_row(),
                              first + kChunk == kRows)
                      .ok());
    }
    ASSERT_TRUE(appender.Flush(absl::Now() + absl::Seconds(60)).ok());
    stub_ = routerreplay::v1::RouterReplayService::NewStub(server_.Channel());
    *request_.mutable_records()->add_records()->mutable_key() = ToProto(key_);
  }

  // Opens a fetch and reads its first message: once that returns, the server serves it.
  bool Open(Stream& stream) {
    stream.reader = stub_->FetchRoutes(&stream.context, request_);
    routerreplay::v1::FetchRoutesResponse first;
    return stream.reader->Read(&first);
  }

  // Whether a new fetch is served within a few seconds (a freed slot comes back once the old
  // stream's reactor is done).
  bool ServedSoon() {
    for (int i = 0; i < 300; ++i) {
      Stream retry;
      const bool served = Open(retry);
      retry.context.TryCancel();
      retry.reader->Finish();
      if (served) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

  // A stub to this router-replay whose fetches run `hook` once their first message arrives.
  std::unique_ptr<routerreplay::v1::RouterReplayService::Stub> StubWithHook(
      std::function<void()> hook) {
    std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> hooks;
    hooks.push_back(std::make_unique<AfterFirstFetchMessage>(std::move(hook)));
    return routerreplay::v1::RouterReplayService::NewStub(
        grpc::experimental::CreateCustomChannelWithInterceptors(
            server_.target(), grpc::InsecureChannelCredentials(), grpc::ChannelArguments(),
            std::move(hooks)));
  }

  static constexpr int kRows = 20000;
  RouteShape layered_{.layers = std::vector<int32_t>(58), .top_k = 8, .num_experts = 256};
  const RecordKey key_{.job_id = "streams", .policy_version = 1, .sample_id = "big"};
  std::vector<int16_t> rows_;
  tandem::testing::LoopbackServer server_;
  std::unique_ptr<routerreplay::v1::RouterReplayService::Stub> stub_;
  routerreplay::v1::FetchRoutesRequest request_;
};

TEST_F(FetchStreamsTest, FetchStreamsAreBoundedAndASlotFreesWhenItsClientLeaves) {
  ASSERT_NO_FATAL_FAILURE(Start({.max_fetch_streams = 2}));
  Stream a, b, c;
  ASSERT_TRUE(Open(a));
  ASSERT_TRUE(Open(b));
  EXPECT_FALSE(Open(c));
  const grpc::Status refused = c.reader->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("--max_fetch_streams"));

  a.context.TryCancel();
  a.reader->Finish();
  EXPECT_TRUE(ServedSoon());
  b.context.TryCancel();
  b.reader->Finish();
}

TEST_F(FetchStreamsTest, AClientThatStopsReadingLosesItsStream) {
  ASSERT_NO_FATAL_FAILURE(
      Start({.max_fetch_streams = 1, .fetch_write_timeout = absl::Milliseconds(200)}));
  Stream stalled;
  SetTimeout(stalled.context, absl::Seconds(30));  // Without the guard: fails, not hangs.
  ASSERT_TRUE(Open(stalled));                      // And reads nothing more.
  EXPECT_TRUE(ServedSoon()) << "the stalled stream kept the only slot";
  routerreplay::v1::FetchRoutesResponse buffered;
  while (stalled.reader->Read(&buffered)) {  // What had reached the client before the cut.
  }
  const grpc::Status ended = stalled.reader->Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::CANCELLED) << ended.error_message();
}

// The trainer fetches a batch whose records are deleted (DeleteRecords, or the TTL sweep) while
// it streams. The delete lands once the first message has arrived, when the server has sent at
// most a flow-control window of the big record and nothing of the small one. Each record comes
// back whole and COMPLETE, or MISSING with every row -1 (routed live); never COMPLETE with rows
// of -1 in place of the deleted ones.
TEST_F(FetchStreamsTest, RecordsDeletedDuringTheTrainersFetchComeBackMissingNotInvented) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  const RecordKey small{.job_id = key_.job_id, .policy_version = 1, .sample_id = "small"};
  constexpr int64_t kSmallRows = 10;
  const std::vector<int16_t> small_rows = SyntheticRoutes(layered_, kSmallRows, 2);
  RouteAppender appender(server_.Channel());
  ASSERT_TRUE(
      appender.Append(small, layered_, 0, kSmallRows, small_rows.data(), /*seal=*/true).ok());
  ASSERT_TRUE(appender.Flush(absl::Now() + absl::Seconds(20)).ok());
  const auto delete_job = [this] {
    routerreplay::v1::DeleteRecordsRequest request;
    request.set_job_id(key_.job_id);
    routerreplay::v1::DeleteRecordsResponse response;
    grpc::ClientContext context;
    SetTimeout(context, absl::Seconds(20));
    const grpc::Status deleted = stub_->DeleteRecords(&context, request, &response);
    EXPECT_TRUE(deleted.ok()) << deleted.error_message();
    EXPECT_EQ(response.records_deleted(), 2);
  };
  std::unique_ptr<routerreplay::v1::RouterReplayService::Stub> trainer = StubWithHook(delete_job);

  const std::vector<ReplaySequence> sequences = {{key_, kRows + 1}, {small, kSmallRows + 1}};
  absl::StatusOr<ReplayRoutes> replay = FetchReplayRoutes(*trainer, sequences,
                                                          {.moe_layers = layered_.layers,
                                                           .top_k = layered_.top_k,
                                                           .num_experts = layered_.num_experts,
                                                           .allow_partial = true});
  ASSERT_TRUE(replay.ok()) << replay.status();
  EXPECT_EQ(replay->statuses[1], routerreplay::v1::RECORD_STATUS_MISSING);
  const int16_t* routes = replay->routes.data();
  for (size_t s = 0; s < sequences.size(); ++s) {
    const std::vector<int16_t>& stored = s == 0 ? rows_ : small_rows;
    const std::string key = ToString(sequences[s].key);
    if (replay->statuses[s] == routerreplay::v1::RECORD_STATUS_COMPLETE) {
      EXPECT_TRUE(std::equal(stored.begin(), stored.end(), routes))
          << key << " is COMPLETE with rows that are not its own";
    } else {
      EXPECT_EQ(replay->statuses[s], routerreplay::v1::RECORD_STATUS_MISSING) << key;
      EXPECT_EQ(std::count(routes, routes + stored.size(), int16_t{-1}),
                static_cast<std::ptrdiff_t>(stored.size()))
          << key << " is MISSING with some of its rows";
    }
    routes += sequences[s].num_tokens * layered_.ids_per_row();
  }
}

}  // namespace
}  // namespace tandem::router_replay
