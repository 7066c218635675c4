// The weight-store binary as its own process, with real UCX between processes over tcp and
// over shared memory: publish by UCX put, fetch by UCX get, and kill -9 of the store during an
// upload and during a fetch followed by restart recovery.
#include <signal.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/health_client.h"
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

INSTANTIATE_TEST_SUITE_P(Transports, WeightStoreProcessTest,
                         ::testing::Values("tcp", "posix,sysv,self,tcp"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "tcp" ? std::string("Tcp") : "SharedMemory";
                         });

}  // namespace
}  // namespace tandem::weight_store
