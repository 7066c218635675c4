// The weight-store binary as its own process, with real UCX between processes over tcp and
// over shared memory: publish by UCX put, fetch by UCX get, and kill -9 of the store during an
// upload, during a fetch, and between a version's announcement and the end of its durable write,
// each followed by restart recovery.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/channel.h"
#include "common/health_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/weight_store/client/adapter_client.h"
#include "tests/service_process.h"
#include "transfer/lora_testing.h"

namespace tandem::weight_store {
namespace {

using tandem::testing::PickFreePort;
using tandem::testing::RunfilePath;
using tandem::testing::ServiceProcess;

// About a MiB in a few dozen tensors, so a fetch takes many messages.
const transfer::TestAdapterSpec kWide{.model = {.num_layers = 3,
                                      .num_dense_layers = 1,
                                      .hidden = 256,
                                      .q_out = 256,
                                      .kv_out = 128,
                                      .dense_ffn = 512,
                                      .expert_ffn = 128,
                                      .num_experts = 8},
                            .rank = 16};

class WeightStoreProcessTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    data_dir_ = ::testing::TempDir() + "/weight-store-process-data";
    std::filesystem::remove_all(data_dir_);
    client_ucx_ = *transfer::UcxWorker::Create({.transports = GetParam()});
  }

  ServiceProcess Start() {
    const int port = PickFreePort();
    auto process = ServiceProcess::Start(
        RunfilePath("services/weight_store/weight_store"),
        {"--host=127.0.0.1", absl::StrCat("--port=", port),
         absl::StrCat("--metrics_port=", PickFreePort()), "--data_dir=" + data_dir_,
         "--ucx_transports=" + GetParam(), "--drain_timeout=1s"},
        ::testing::TempDir() + "/weight_store.log");
    EXPECT_TRUE(process.ok()) << process.status();
    const std::string target = absl::StrCat("127.0.0.1:", port);
    EXPECT_TRUE(WaitUntilServing({.target = target}, "tandem.weightstore.v1.WeightStoreService",
                                 absl::Seconds(30))
                    .ok());
    stub_ = std::make_unique<WeightStoreStubs>(*CreateChannel(
        {.target = target, .service_name = "tandem.weightstore.v1.WeightStoreService"}));
    return *std::move(process);
  }

  weightstore::v1::TargetLayout Stacked() {
    weightstore::v1::TargetLayout target;
    target.set_stack_experts(true);
    return target;
  }

  std::string data_dir_;
  std::unique_ptr<transfer::UcxWorker> client_ucx_;
  std::unique_ptr<WeightStoreStubs> stub_;
};

TEST_P(WeightStoreProcessTest, UcxPublishAndFetchBetweenProcessesSurviveKillDashNine) {
  const transfer::TestAdapter committed = transfer::MakeTestAdapter("job-1", 1, 21, kWide);
  {
    ServiceProcess store = Start();
    ASSERT_TRUE(PublishAdapter(*stub_, committed.manifest, committed.shard_views(),
                               {.ucx = client_ucx_.get()})
                    .ok());
    absl::StatusOr<FetchedAdapter> fetched =
        FetchAdapter(*stub_, "job-1", 1, {.target = Stacked(), .ucx = client_ucx_.get()});
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    EXPECT_TRUE(fetched->by_ucx);
    for (const FetchedTensor& tensor : fetched->tensors) {
      bool matched = false;
      for (const auto& [name, bytes] : committed.canonical) {
        matched =
            matched || (transfer::StackedName(name) == tensor.tensor.spec().name() && bytes == tensor.bytes);
      }
      EXPECT_TRUE(matched) << tensor.tensor.spec().name();
    }

    // Killed mid-upload: version 2 began, half its first shard arrived, no commit.
    const transfer::TestAdapter interrupted = transfer::MakeTestAdapter("job-1", 2, 22, kWide);
    weightstore::v1::BeginPublishRequest begin;
    *begin.mutable_manifest() = interrupted.manifest;
    weightstore::v1::BeginPublishResponse begun;
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->api().BeginPublish(&context, begin, &begun).ok());
    grpc::ClientContext put_context;
    weightstore::v1::PutShardResponse put_response;
    auto writer = stub_->api().PutShard(&put_context, &put_response);
    weightstore::v1::PutShardRequest chunk;
    chunk.set_upload_id(begun.upload_id());
    chunk.set_data(interrupted.shards[0].substr(0, interrupted.shards[0].size() / 2));
    writer->Write(chunk);
    const int status = store.Stop(SIGKILL);
    ASSERT_TRUE(WIFSIGNALED(status));
  }
  {
    ServiceProcess store = Start();
    absl::StatusOr<FetchedAdapter> recovered =
        FetchAdapter(*stub_, "job-1", 1, {.target = Stacked(), .ucx = client_ucx_.get()});
    ASSERT_TRUE(recovered.ok()) << recovered.status();
    EXPECT_TRUE(recovered->by_ucx);
    EXPECT_EQ(FetchAdapter(*stub_, "job-1", 2, {}).status().code(), absl::StatusCode::kNotFound);

    // Killed mid-fetch: the reader gets an error promptly, or (when gRPC had already buffered
    // the whole stream) every byte; never a hang or a silently short result.
    weightstore::v1::FetchTensorsRequest request;
    request.set_adapter_name("job-1");
    request.set_version(1);
    request.mutable_target();  // Required; empty: one rank.
    request.set_max_chunk_bytes(1 << 20);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    auto reader = stub_->api().FetchTensors(&context, request);
    weightstore::v1::FetchTensorsResponse chunk;
    ASSERT_TRUE(reader->Read(&chunk));
    size_t received = chunk.data().size();
    store.Stop(SIGKILL);
    while (reader->Read(&chunk)) received += chunk.data().size();
    const grpc::Status ended = reader->Finish();
    size_t total = 0;
    for (const auto& [name, bytes] : committed.canonical) total += bytes.size();
    EXPECT_TRUE(!ended.ok() || received == total) << received << " of " << total;
    EXPECT_NE(ended.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << ended.error_message();
    absl::StatusOr<FetchedAdapter> after_death =
        FetchAdapter(*stub_, "job-1", 1,
                     {.target = Stacked(), .ucx = client_ucx_.get(), .timeout = absl::Seconds(5)});
    EXPECT_FALSE(after_death.ok());
  }
  ServiceProcess store = Start();  // Restart recovery once more, after the second kill.
  EXPECT_TRUE(FetchAdapter(*stub_, "job-1", 1, {.target = Stacked()}).ok());
  EXPECT_EQ(store.Stop(SIGTERM), 0);
}

// Shared memory only: a replica fetching from a pushed plan copies straight out of the store's
// memory, fast enough to be done while the store is still writing the version to disk.
using WeightStoreCrashTest = WeightStoreProcessTest;

// SIGSTOP stops a process's threads one by one, after kill() returns: waits until every thread
// is stopped, so that nothing under way (a rename, say) changes the process's files afterwards.
void WaitUntilStopped(pid_t pid) {
  const std::filesystem::path tasks = absl::StrCat("/proc/", pid, "/task");
  for (int attempt = 0; attempt < 5000; ++attempt) {
    bool stopped = true;
    for (const std::filesystem::directory_entry& task :
         std::filesystem::directory_iterator(tasks)) {
      // "<tid> (<name>) <state> ...": the state follows the name's closing parenthesis.
      std::ifstream stat(task.path() / "stat");
      std::string line;
      std::getline(stat, line);
      const size_t name_end = line.rfind(')');
      stopped = stopped && name_end != std::string::npos && name_end + 2 < line.size() &&
                line[name_end + 2] == 'T';
    }
    if (stopped) return;
    absl::SleepFor(absl::Milliseconds(1));
  }
  ADD_FAILURE() << "process " << pid << " did not stop";
}

bool SameTensors(const FetchedAdapter& a, const FetchedAdapter& b) {
  if (a.tensors.size() != b.tensors.size()) return false;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    if (a.tensors[i].tensor.spec().name() != b.tensors[i].tensor.spec().name() ||
        a.tensors[i].bytes != b.tensors[i].bytes) {
      return false;
    }
  }
  return true;
}

TEST_P(WeightStoreCrashTest, AVersionFetchedBeforeItWasDurableIsServedAgainOnlyWithItsBytes) {
  ServiceProcess store = Start();
  ASSERT_TRUE(PublishAdapter(*stub_, transfer::MakeTestAdapter("job-1", 1, 31, kWide).manifest,
                             transfer::MakeTestAdapter("job-1", 1, 31, kWide).shard_views(),
                             {.ucx = client_ucx_.get()})
                  .ok());
  // A replica watching with its layout registered: each announcement brings a lease and a plan.
  AdapterFetcher fetcher(*stub_);
  grpc::ClientContext watch_context;
  internal::v1::WatchReadPlansRequest watch;
  watch.set_adapter_name("job-1");
  *watch.mutable_target() = Stacked();
  watch.set_holder("crash-test-replica");
  auto announcements = stub_->ucx().WatchReadPlans(&watch_context, watch);
  internal::v1::WatchReadPlansResponse announced;
  FetchedAdapter replica;
  const FetchOptions fetch_options{.target = Stacked(), .ucx = client_ucx_.get()};
  ASSERT_TRUE(announcements->Read(&announced));
  ASSERT_TRUE(fetcher.FetchAnnounced("job-1", announced, fetch_options, replica).ok());

  // About 160 MiB a version: ~0.1 s of write and fsync here. The store is stopped as soon as
  // the version is announced, before its write can end, and the replica copies the version out
  // of the stopped store's memory (the plan and the lease came with the announcement); if the
  // write had ended all the same, the next version is tried.
  std::optional<transfer::TestAdapter> lost;
  absl::Status lost_commit;
  for (int64_t version = 2; version <= 4 && !lost; ++version) {
    transfer::TestAdapter adapter = transfer::MakeTestAdapter("job-1", version, 31 + version,
                                                              transfer::TestAdapterSpecOfSize(160));
    absl::Status committed;
    std::thread publisher([&] {
      committed = PublishAdapter(*stub_, adapter.manifest, adapter.shard_views(),
                                 {.ucx = client_ucx_.get()})
                      .status();
    });
    ASSERT_TRUE(announcements->Read(&announced));
    ASSERT_EQ(announced.announcement().version().version(), version);
    ::kill(store.pid(), SIGSTOP);
    WaitUntilStopped(store.pid());
    if (std::filesystem::exists(data_dir_ + "/job-1/" + std::to_string(version))) {
      ::kill(store.pid(), SIGCONT);
      publisher.join();
      continue;
    }
    const FetchOptions from_stopped_store{
        .target = Stacked(), .ucx = client_ucx_.get(), .timeout = absl::Seconds(20)};
    const absl::Status fetched =
        fetcher.FetchAnnounced("job-1", announced, from_stopped_store, replica);
    ASSERT_TRUE(WIFSIGNALED(store.Stop(SIGKILL)));
    publisher.join();
    ASSERT_TRUE(fetched.ok()) << fetched;
    ASSERT_TRUE(replica.mapped);
    lost = std::move(adapter);
    lost_commit = committed;
  }
  ASSERT_TRUE(lost) << "every version was durable as soon as it was announced";
  EXPECT_FALSE(lost_commit.ok()) << "CommitPublish returned before the version was durable";
  watch_context.TryCancel();
  announcements->Finish();
  const int64_t version = lost->manifest.version();

  // Restarted: the version is not served (its publisher's commit failed), and it is taken again
  // only with the manifest the replica's copy was announced with.
  ServiceProcess restarted = Start();
  const absl::Status gone = FetchAdapter(*stub_, "job-1", version, {}).status();
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound) << gone;
  EXPECT_THAT(std::string(gone.message()), ::testing::HasSubstr("lost before it was durable"));
  EXPECT_TRUE(FetchAdapter(*stub_, "job-1", version - 1, {.target = Stacked()}).ok());
  const transfer::TestAdapter other_bytes = transfer::MakeTestAdapter("job-1", version, 99, kWide);
  const absl::Status refused =
      PublishAdapter(*stub_, other_bytes.manifest, other_bytes.shard_views(), {}).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  ASSERT_TRUE(
      PublishAdapter(*stub_, lost->manifest, lost->shard_views(), {.ucx = client_ucx_.get()}).ok());
  absl::StatusOr<FetchedAdapter> served =
      FetchAdapter(*stub_, "job-1", version, {.target = Stacked(), .ucx = client_ucx_.get()});
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_TRUE(SameTensors(*served, replica)) << "the replica holds other bytes under " << version;
  ASSERT_TRUE(WIFSIGNALED(restarted.Stop(SIGKILL)));

  // Committed this time: read back from disk (its shards written with O_DIRECT) after a crash.
  ServiceProcess again = Start();
  absl::StatusOr<FetchedAdapter> recovered =
      FetchAdapter(*stub_, "job-1", version, {.target = Stacked()});
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_TRUE(SameTensors(*recovered, replica));
  EXPECT_EQ(again.Stop(SIGTERM), 0);
}

INSTANTIATE_TEST_SUITE_P(SharedMemory, WeightStoreCrashTest,
                         ::testing::Values("posix,sysv,self,tcp"));

INSTANTIATE_TEST_SUITE_P(Transports, WeightStoreProcessTest,
                         ::testing::Values("tcp", "posix,sysv,self,tcp"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "tcp" ? std::string("Tcp") : "SharedMemory";
                         });

}  // namespace
}  // namespace tandem::weight_store
