// Each service binary as a real process on loopback: health, auth, metrics, the validation
// error of an empty request, SIGTERM drain and bad flags.
#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "common/channel.h"
#include "common/health_client.h"
#include "common/testing/http_get.h"
#include "engine/cuda/device_engines.h"
#include "engine/model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tandem/rollout/v1/rollout.grpc.pb.h"
#include "tandem/routerreplay/v1/router_replay.grpc.pb.h"
#include "tandem/trainer/v1/trainer.grpc.pb.h"
#include "tandem/weightstore/v1/weight_store.grpc.pb.h"
#include "tests/service_process.h"

namespace tandem::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kToken[] = "integration-token";

// One unary RPC of a service, called with an empty request.
using CallOne = std::function<grpc::Status(std::shared_ptr<grpc::Channel>, grpc::ClientContext*)>;

template <typename Service, typename Request, typename Response>
CallOne Call(grpc::Status (Service::Stub::*method)(grpc::ClientContext*, const Request&,
                                                   Response*)) {
  return [method](std::shared_ptr<grpc::Channel> channel, grpc::ClientContext* context) {
    Response response;
    return (Service::NewStub(channel).get()->*method)(context, Request(), &response);
  };
}

struct ServiceCase {
  std::string name;
  std::string binary;
  std::string proto_service;
  std::string method;
  CallOne call;
  // What the empty request gets: the validation error for its first required field.
  grpc::StatusCode expected_code;
  std::string expected_code_name;
  std::string expected_message;
  std::vector<std::string> extra_args;
};

// The rollout serves a base model; a random one of the default config will do.
std::string BaseModelPath() {
  static const std::string path = [] {
    const std::string file = ::testing::TempDir() + "/base_model.safetensors";
    const absl::Status saved =
        engine::BaseModel::Create(engine::DefaultModelConfig(), 1)->Save(file);
    EXPECT_TRUE(saved.ok()) << saved;
    return file;
  }();
  return path;
}

std::string ReadLog(const std::string& path) {
  std::ifstream in(path);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

class ServiceBinaryTest : public ::testing::TestWithParam<ServiceCase> {
 protected:
  std::string LogPath() const { return ::testing::TempDir() + "/" + GetParam().name + ".log"; }

  grpc::Status CallWithToken(const std::string& target, const std::string& token) {
    auto channel = *CreateChannel(
        {.target = target, .service_name = GetParam().proto_service, .auth_token = token});
    grpc::ClientContext context;
    SetTimeout(context, absl::Seconds(10));
    return GetParam().call(channel, &context);
  }
};

TEST_P(ServiceBinaryTest, ServesWithAuthAndMetricsThenDrainsOnSigterm) {
  const std::string token_file = ::testing::TempDir() + "/token";
  std::ofstream(token_file) << kToken << "\n";
  const int port = PickFreePort();
  const int metrics_port = PickFreePort();
  std::vector<std::string> args = {"--host=127.0.0.1", absl::StrCat("--port=", port),
                                   absl::StrCat("--metrics_port=", metrics_port),
                                   "--auth_token_file=" + token_file};
  args.insert(args.end(), GetParam().extra_args.begin(), GetParam().extra_args.end());
  auto process = ServiceProcess::Start(RunfilePath(GetParam().binary), args, LogPath());
  ASSERT_TRUE(process.ok()) << process.status();
  const std::string target = absl::StrCat("127.0.0.1:", port);

  ASSERT_TRUE(
      WaitUntilServing({.target = target}, GetParam().proto_service, absl::Seconds(20)).ok())
      << ReadLog(LogPath());

  const grpc::Status authorized = CallWithToken(target, kToken);
  EXPECT_EQ(authorized.error_code(), GetParam().expected_code);
  EXPECT_THAT(authorized.error_message(), HasSubstr(GetParam().expected_message));
  EXPECT_EQ(CallWithToken(target, "").error_code(), grpc::StatusCode::UNAUTHENTICATED);

  auto page = HttpGet(absl::StrCat("http://127.0.0.1:", metrics_port, "/metrics"));
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_THAT(*page, HasSubstr(absl::StrCat("tandem_build_info{service=\"", GetParam().name)));
  // Ready, so no longer loading (the gauge was 1 from before the service was built).
  EXPECT_THAT(*page, HasSubstr(absl::StrCat("tandem_service_loading{service=\"", GetParam().name,
                                            "\"} 0")));
  EXPECT_THAT(*page, HasSubstr(absl::StrCat("tandem_rpc_server_handled_total{code=\"",
                                            GetParam().expected_code_name, "\",method=\"",
                                            GetParam().method, "\"")));
  EXPECT_THAT(*page, HasSubstr(absl::StrCat("tandem_auth_rejected_total{service=\"",
                                            GetParam().name, "\"} 1")));

  const int status = process->Stop(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadLog(LogPath());
  EXPECT_THAT(ReadLog(LogPath()), HasSubstr(GetParam().name + " stopped"));
}

TEST_P(ServiceBinaryTest, BadFlagValueExitsWithAClearMessage) {
  auto process = ServiceProcess::Start(RunfilePath(GetParam().binary), {"--port=70000"}, LogPath());
  ASSERT_TRUE(process.ok()) << process.status();
  const int status = process->Wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2);
  EXPECT_THAT(ReadLog(LogPath()), HasSubstr("--port=70000 is not a port"));
}

TEST_P(ServiceBinaryTest, UnknownFlagIsRefused) {
  auto process =
      ServiceProcess::Start(RunfilePath(GetParam().binary), {"--no_such_flag=1"}, LogPath());
  ASSERT_TRUE(process.ok()) << process.status();
  const int status = process->Wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2);
  EXPECT_THAT(ReadLog(LogPath()), HasSubstr("unknown command line flag 'no_such_flag'"));
}

// absl's own parser ends the process with status 1 on a value it cannot read; bad flags are 2.
TEST_P(ServiceBinaryTest, UnparsableFlagValueExitsWithStatus2) {
  auto process = ServiceProcess::Start(RunfilePath(GetParam().binary), {"--port=abc"}, LogPath());
  ASSERT_TRUE(process.ok()) << process.status();
  const int status = process->Wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2);
  EXPECT_THAT(ReadLog(LogPath()), HasSubstr("--port=abc"));
}

// The trainer and the rollout check --device before they serve: a name they do not know, and a GPU
// on a machine without one, end the process with a message saying which.
TEST(DeviceFlagTest, TrainerAndRolloutRefuseAnUnusableDevice) {
  const std::string log = ::testing::TempDir() + "/device.log";
  const std::vector<std::pair<std::string, std::vector<std::string>>> services = {
      {"services/trainer/trainer", {"--data_dir=" + ::testing::TempDir() + "/device-trainer"}},
      {"services/rollout/rollout", {"--base_model=/nonexistent/model.safetensors"}}};
  // Runs the binary with `args` plus `device` to its exit; the wait status.
  const auto run = [&](const std::string& binary, std::vector<std::string> args,
                       const std::string& device) {
    args.push_back(device);
    auto process = ServiceProcess::Start(RunfilePath(binary), args, log);
    EXPECT_TRUE(process.ok()) << process.status();
    return process.ok() ? process->Wait() : -1;
  };
  for (const auto& [binary, args] : services) {
    SCOPED_TRACE(binary);
    int status = run(binary, args, "--device=gpu0");
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0);
    EXPECT_THAT(ReadLog(log), HasSubstr("--device=gpu0"));
    if (engine::CudaDeviceVisible()) continue;
    status = run(binary, args, "--device=cuda");
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0);
    EXPECT_THAT(ReadLog(log), HasSubstr("--device=cuda"));
  }
}

// Where jobs find the other services is the trainer's configuration: without rollout replicas
// or a weight-store it does not start, and says which flag is missing.
TEST(TrainerFlagTest, TheTrainerRefusesToStartWithoutItsPeersNamingTheFlag) {
  const std::string log = ::testing::TempDir() + "/peers.log";
  const std::string data = "--data_dir=" + ::testing::TempDir() + "/peers-trainer";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{data, "--weight_store=127.0.0.1:1"}, "--rollout: 1..256 addresses required"},
      {{data, "--rollout=127.0.0.1:1"}, "--weight_store is required"},
      {{data, "--rollout=127.0.0.1:1", "--rollout_service=rollout:1", "--weight_store=s:1"},
       "--rollout and --rollout_service are exclusive"}};
  for (const auto& [args, message] : cases) {
    SCOPED_TRACE(message);
    auto process = ServiceProcess::Start(RunfilePath("services/trainer/trainer"), args, log);
    ASSERT_TRUE(process.ok()) << process.status();
    const int status = process->Wait();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0);
    EXPECT_THAT(ReadLog(log), HasSubstr(message));
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllServices, ServiceBinaryTest,
    ::testing::Values(
        ServiceCase{"trainer",
                    "services/trainer/trainer",
                    "tandem.trainer.v1.JobService",
                    "GetJob",
                    Call<trainer::v1::JobService>(&trainer::v1::JobService::Stub::GetJob),
                    grpc::StatusCode::INVALID_ARGUMENT,
                    "INVALID_ARGUMENT",
                    "job_id or name is required",
                    {"--data_dir=" + ::testing::TempDir() + "/trainer-data", "--ucx=false",
                     "--rollout=127.0.0.1:1", "--weight_store=127.0.0.1:1"}},
        ServiceCase{"rollout",
                    "services/rollout/rollout",
                    "tandem.rollout.v1.RolloutService",
                    "Generate",
                    [](std::shared_ptr<grpc::Channel> channel, grpc::ClientContext* context) {
                      auto reader = rollout::v1::RolloutService::NewStub(channel)->Generate(
                          context, rollout::v1::GenerateRequest());
                      rollout::v1::GenerateResponse response;
                      while (reader->Read(&response)) {
                      }
                      return reader->Finish();
                    },
                    grpc::StatusCode::INVALID_ARGUMENT,
                    "INVALID_ARGUMENT",
                    "bad request_id: ''",
                    {"--base_model=" + BaseModelPath()}},
        ServiceCase{
            "weight-store",
            "services/weight_store/weight_store",
            "tandem.weightstore.v1.WeightStoreService",
            "GetManifest",
            Call<weightstore::v1::WeightStoreService>(
                &weightstore::v1::WeightStoreService::Stub::GetManifest),
            grpc::StatusCode::INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
            "bad adapter.adapter_name: ''",
            {"--data_dir=" + ::testing::TempDir() + "/weight-store-data", "--ucx_transports=tcp"}},
        ServiceCase{"router-replay",
                    "services/router_replay/router_replay",
                    "tandem.routerreplay.v1.RouterReplayService",
                    "Seal",
                    Call<routerreplay::v1::RouterReplayService>(
                        &routerreplay::v1::RouterReplayService::Stub::Seal),
                    grpc::StatusCode::INVALID_ARGUMENT,
                    "INVALID_ARGUMENT",
                    "bad job_id: ''",
                    {"--data_dir=" + ::testing::TempDir() + "/router-replay-data"}}),
    [](const ::testing::TestParamInfo<ServiceCase>& info) {
      std::string name = info.param.name;
      std::replace(name.begin(), name.end(), '-', '_');
      return name;
    });

}  // namespace
}  // namespace tandem::testing
