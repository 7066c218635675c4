// Figures of router-replay: stored bytes per token against int32 / int16 / uint8 and the
// information floor, for a DeepSeek-V3 shape (58 MoE layers, top-8, 256 experts) with skewed
// synthetic routing and for routes the embedded engine produced; then ingest tokens/s and
// fetch MB/s through a real gRPC server on loopback, with one and several concurrent clients.
// Prints its figures, and exits 1 when one client's ingest is below --ingest_goal.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/process_status.h"
#include "common/server.h"
#include "common/testing/test_server.h"
#include "engine/config.h"
#include "engine/cpu_model_ops.h"
#include "engine/generator.h"
#include "engine/hf/hf_model.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/sft.h"
#include "engine/tasks.h"
#include "engine/tokenizer.h"
#include "services/router_replay/client/route_appender.h"
#include "services/router_replay/client/testing/route_testing.h"
#include "services/router_replay/route_queries.h"
#include "services/router_replay/router_replay_service.h"

ABSL_FLAG(int, records, 64, "Records (samples) per client in the loopback runs.");
ABSL_FLAG(int, rows, 1024, "Rows (tokens) per record.");
ABSL_FLAG(int, chunk_rows, 64, "Rows per Append call, as a rollout flushes a few decode steps.");
ABSL_FLAG(int, clients, 4, "Concurrent clients in the multi-client runs.");
ABSL_FLAG(double, skew, 1.0, "Zipf exponent of synthetic expert popularity (0 = uniform).");
ABSL_FLAG(std::string, base_model, "",
          "Trained base model for the engine routes (make_base_model); empty: random weights.");
ABSL_FLAG(std::string, data_dir, "/tmp/tandem-router-replay-bench", "Scratch store directory.");
ABSL_FLAG(double, ingest_goal, 200000,
          "Tokens/s one client must ingest (docs/performance.md); below it the bench exits 1, "
          "so that it can run as a check.");

namespace tandem::router_replay {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

RouteShape DeepSeekV3Shape() {
  RouteShape shape{.top_k = 8, .num_experts = 256};
  for (int layer = 3; layer < 61; ++layer) shape.layers.push_back(layer);  // 3 dense layers first.
  return shape;
}

// log2 of the number of ordered and unordered choices of k of E, per token over all layers,
// in bytes.
double FloorBytes(const RouteShape& shape, bool ordered) {
  double bits = 0;
  for (int i = 0; i < shape.top_k; ++i) bits += std::log2(shape.num_experts - i);
  if (!ordered) bits -= std::lgamma(shape.top_k + 1.0) / std::log(2.0);
  return bits * static_cast<double>(shape.layers.size()) / 8;
}

// Stores `records` in a fresh RouteStore in chunks of chunk_rows and returns bytes per token.
double StoredBytesPerToken(const RouteShape& shape,
                           const std::vector<std::vector<int16_t>>& records, int chunk_rows,
                           int zstd_level) {
  const std::string path = absl::GetFlag(FLAGS_data_dir) + "-bytes";
  std::filesystem::remove_all(path);
  auto store =
      *RouteStore::Open({.path = path, .sync = SyncPolicy::kNever, .zstd_level = zstd_level});
  int64_t tokens = 0;
  for (size_t r = 0; r < records.size(); ++r) {
    const int64_t rows = static_cast<int64_t>(records[r].size()) / shape.ids_per_row();
    for (int64_t first = 0; first < rows; first += chunk_rows) {
      const int64_t count = std::min<int64_t>(chunk_rows, rows - first);
      const RouteChunk chunk{
          .key = {.job_id = "bench", .policy_version = 1, .sample_id = absl::StrCat("s", r)},
          .shape = shape,
          .first_row = first,
          .num_rows = count,
          .rows = records[r].data() + first * shape.ids_per_row()};
      if (auto outcome = store->Append(chunk); !outcome.ok()) {
        std::fprintf(stderr, "append failed: %s\n", outcome.status().ToString().c_str());
        std::exit(1);
      }
    }
    tokens += rows;
  }
  const double bytes = static_cast<double>(store->totals().stored_bytes);
  store.reset();
  std::filesystem::remove_all(path);
  return bytes / static_cast<double>(tokens);
}

void PrintStorageRow(const char* label, const RouteShape& shape,
                     const std::vector<std::vector<int16_t>>& records) {
  const double ids = static_cast<double>(shape.ids_per_row());
  const int chunk = absl::GetFlag(FLAGS_chunk_rows);
  const double packed = StoredBytesPerToken(shape, records, chunk, 0);
  const double zstd = StoredBytesPerToken(shape, records, chunk, 1);
  const double zstd_big = StoredBytesPerToken(shape, records, 1024, 1);
  std::printf(
      "%-34s int32 %7.1f  int16 %7.1f  uint8 %7.1f  floor(ordered) %7.1f  floor(set) %7.1f | "
      "packed %7.1f  +zstd %7.1f  +zstd/1024-row blocks %7.1f B/token  (%.2f bits/id best)\n",
      label, ids * 4, ids * 2, ids, FloorBytes(shape, true), FloorBytes(shape, false), packed, zstd,
      zstd_big, 8 * std::min({packed, zstd, zstd_big}) / ids);
}

// Routes of samples the embedded engine generated in bf16 rollout mode: the trained base model
// when --base_model names one, else random default-config weights.
std::vector<std::vector<int16_t>> EngineRoutes(const engine::ModelConfig& config, int samples) {
  const std::string path = absl::GetFlag(FLAGS_base_model);
  auto model =
      path.empty() ? *engine::BaseModel::Create(config, 11) : *engine::hf::LoadBaseModel(path);
  engine::Transformer transformer(model, nullptr,
                                  std::make_unique<engine::CpuModelOps>(model.config()),
                                  engine::Precision::kBF16);
  std::vector<engine::GenerationRequest> requests;
  const std::unique_ptr<engine::Task> task = *engine::MakeTask("addition", 2);
  int index = 0;
  for (const engine::Sample& sample : engine::GeneratePrompts(*task, samples, 3)) {
    requests.push_back({.prompt = *engine::PromptTokens(sample.prompt),
                        .max_new_tokens = 24,
                        .seed = engine::MixSeed(3, index++)});
  }
  std::vector<engine::GeneratedSample> generated = *engine::Generate(transformer, requests);
  std::vector<std::vector<int16_t>> routes;
  for (engine::GeneratedSample& sample : generated) {
    routes.push_back(std::move(sample.routes));
  }
  return routes;
}

using tandem::testing::LoopbackServer;

LoopbackServer StartServer() {
  const std::string path = absl::GetFlag(FLAGS_data_dir);
  std::filesystem::remove_all(path);
  ServerOptions options = tandem::testing::LoopbackOptions();
  options.max_message_bytes = 8 << 20;
  return *tandem::testing::StartLoopbackServer(
      "router-replay",
      {"tandem.routerreplay.v1.RouterReplayService",
       *RouterReplayServiceImpl::Create({.store = {.path = path}})},
      options);
}

// Every client appends its own records in decode-sized chunks; returns tokens/s until all
// are acknowledged durable (fsync=ack).
double Ingest(const LoopbackServer& server, int clients, int first_client, const RouteShape& shape,
              const std::vector<int16_t>& rows) {
  const int records = absl::GetFlag(FLAGS_records);
  const int rows_per_record = absl::GetFlag(FLAGS_rows);
  const int chunk = absl::GetFlag(FLAGS_chunk_rows);
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      RouteAppender appender(server.Channel());
      for (int r = 0; r < records; ++r) {
        const RecordKey key{.job_id = "bench",
                            .policy_version = first_client + c,
                            .sample_id = absl::StrCat("c", c, "/s", r)};
        for (int first = 0; first < rows_per_record; first += chunk) {
          absl::Status status;
          do {  // A full buffer pushes back; wait for room like a rollout would.
            status = appender.Append(key, shape, first, chunk,
                                     rows.data() + int64_t{first} * shape.ids_per_row(),
                                     first + chunk >= rows_per_record);
          } while (absl::IsResourceExhausted(status));
          if (!status.ok()) std::fprintf(stderr, "append: %s\n", status.ToString().c_str());
        }
      }
      if (absl::Status status = appender.Flush(absl::InfiniteFuture()); !status.ok()) {
        std::fprintf(stderr, "flush: %s\n", status.ToString().c_str());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  return static_cast<double>(clients) * records * rows_per_record / SecondsSince(start);
}

// Each client fetches its data-parallel share of the job; returns MB/s of int16 rows received.
double Fetch(const LoopbackServer& server, int clients) {
  std::atomic<int64_t> bytes{0};
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      auto stub = routerreplay::v1::RouterReplayService::NewStub(server.Channel());
      routerreplay::v1::FetchRoutesRequest request;
      request.mutable_job()->set_job_id("bench");
      request.set_dp_rank(c);
      request.set_dp_size(clients);
      grpc::ClientContext context;
      auto reader = stub->FetchRoutes(&context, request);
      routerreplay::v1::FetchRoutesResponse message;
      while (reader->Read(&message)) bytes += static_cast<int64_t>(message.rows().size());
      if (grpc::Status status = reader->Finish(); !status.ok()) {
        std::fprintf(stderr, "fetch: %s\n", status.error_message().c_str());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  return static_cast<double>(bytes) / 1e6 / SecondsSince(start);
}

// Returns whether one client's ingest met --ingest_goal.
bool Run() {
  const RouteShape v3 = DeepSeekV3Shape();
  const double skew = absl::GetFlag(FLAGS_skew);
  std::printf("== Stored bytes per token (blocks of %d rows unless noted)\n",
              absl::GetFlag(FLAGS_chunk_rows));
  std::vector<std::vector<int16_t>> skewed, uniform;
  for (int r = 0; r < 16; ++r) {
    skewed.push_back(SyntheticRoutes(v3, 1024, r, skew));
    uniform.push_back(SyntheticRoutes(v3, 1024, 100 + r, 0.0));
  }
  PrintStorageRow(absl::StrCat("DeepSeek-V3 shape, Zipf ", skew).c_str(), v3, skewed);
  PrintStorageRow("DeepSeek-V3 shape, uniform", v3, uniform);
  const engine::ModelConfig config = engine::DefaultModelConfig();
  const RouteShape engine_shape{
      .layers = config.MoeLayerIndices(), .top_k = config.top_k, .num_experts = config.num_experts};
  PrintStorageRow("engine default (3 MoE, top-2 of 8)", engine_shape, EngineRoutes(config, 256));

  const int tokens = absl::GetFlag(FLAGS_records) * absl::GetFlag(FLAGS_rows);
  std::printf(
      "\n== Loopback gRPC, DeepSeek-V3 shape (%zu B/token as int16), %d tokens per client\n",
      static_cast<size_t>(v3.ids_per_row() * 2), tokens);
  const std::vector<int16_t> rows = SyntheticRoutes(v3, absl::GetFlag(FLAGS_rows), 7, skew);
  LoopbackServer server = StartServer();
  const int clients = absl::GetFlag(FLAGS_clients);
  const double ingest_one = Ingest(server, 1, 0, v3, rows);
  const double ingest_many = Ingest(server, clients, 1, v3, rows);
  std::printf("ingest  1 client : %9.0f tokens/s  (%6.1f MB/s int16)\n", ingest_one,
              ingest_one * v3.ids_per_row() * 2 / 1e6);
  std::printf("ingest %2d clients: %9.0f tokens/s  (%6.1f MB/s int16)\n", clients, ingest_many,
              ingest_many * v3.ids_per_row() * 2 / 1e6);
  std::printf("fetch   1 client : %9.1f MB/s\n", Fetch(server, 1));
  std::printf("fetch  %2d clients: %9.1f MB/s (dp-sharded, together)\n", clients,
              Fetch(server, clients));
  server.server->Drain();
  std::printf("peak resident memory of this process (server + clients): %.0f MiB\n",
              PeakResidentMiB());
  std::filesystem::remove_all(absl::GetFlag(FLAGS_data_dir));
  const double goal = absl::GetFlag(FLAGS_ingest_goal);
  if (ingest_one >= goal) return true;
  std::printf("FAILED: ingest with 1 client %.0f tokens/s is below the goal of %.0f\n", ingest_one,
              goal);
  return false;
}

}  // namespace
}  // namespace tandem::router_replay

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tandem::router_replay::Run() ? 0 : 1;
}
