// StepPublisher against the real weight-store on loopback and fake rollout replicas: versions
// published with their labels, the newest found, and the swap awaited as the replicas tell it.
#include "services/trainer/step/step_publisher.h"

#include <atomic>
#include <memory>

#include "common/channel.h"
#include "common/status.h"
#include "common/testing/simulated_clock.h"
#include "common/testing/test_dir.h"
#include "common/testing/test_server.h"
#include "engine/testing/test_models.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "services/rollout/client/testing/fake_rollout.h"
#include "services/weight_store/client/engine_lora.h"
#include "services/weight_store/client/testing/weight_store_server.h"
#include "tandem/weightstore/v1/weight_store.grpc.pb.h"

namespace tandem::trainer {
namespace {

class StepPublisherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = weight_store::testing::StartWeightStore(
        {.data_dir = tandem::testing::FreshTestDir("step_publisher") + "/weights",
         .enable_ucx = false});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    stubs_ = std::make_unique<weight_store::WeightStoreStubs>(store_.Channel());
    model_ = engine::test_models::TinyConfig();
    lora_ = std::make_unique<engine::LoraAdapter>(
        *engine::LoraAdapter::Create(model_, engine::test_models::TestLora(model_), 3));
    publisher_ = std::make_unique<StepPublisher>(
        StepPublisherConfig{.job_id = "job-1",
                            .adapter_name = "policy",
                            .architecture = "Qwen3MoeForCausalLM",
                            .rpc_timeout = absl::Seconds(10),
                            .outage = {.budget = absl::Seconds(1)},
                            .swap = {.timeout = absl::Seconds(5)}},
        *stubs_, std::vector<rollout::ReplicaStub>{{.address = "replica-0", .stub = &replica_}},
        cancelled_, clock_);
  }

  weightstore::v1::Manifest ManifestOf(int64_t version) {
    weightstore::v1::GetManifestRequest request;
    request.mutable_adapter()->set_adapter_name("policy");
    request.mutable_adapter()->set_exact_version(version);
    weightstore::v1::GetManifestResponse response;
    grpc::ClientContext context;
    SetTimeout(context, absl::Seconds(10));
    EXPECT_TRUE(stubs_->api().GetManifest(&context, request, &response).ok());
    return response.manifest();
  }

  tandem::testing::LoopbackServer store_;
  std::unique_ptr<weight_store::WeightStoreStubs> stubs_;
  engine::ModelConfig model_;
  std::unique_ptr<engine::LoraAdapter> lora_;
  rollout::testing::FakeRolloutState replica_state_;
  rollout::testing::FakeRolloutStub replica_{replica_state_};
  std::atomic<bool> cancelled_{false};
  tandem::testing::SimulatedClock clock_;
  std::unique_ptr<StepPublisher> publisher_;
};

TEST_F(StepPublisherTest, PublishesLabelledVersionsAndFindsTheNewest) {
  EXPECT_EQ(*publisher_->NewestVersion(), 0) << "an adapter with no version yet";
  ASSERT_TRUE(publisher_->Publish(*lora_, model_, 1, 0, nullptr).ok());
  ASSERT_TRUE(publisher_->Publish(*lora_, model_, 2, 1, nullptr).ok());
  EXPECT_EQ(*publisher_->NewestVersion(), 2);
  const weightstore::v1::Manifest manifest = ManifestOf(2);
  EXPECT_EQ(manifest.labels().at("job_id"), "job-1");
  EXPECT_EQ(manifest.labels().at("step"), "1");
  EXPECT_EQ(manifest.labels().at(weight_store::kArchitectureLabel), "Qwen3MoeForCausalLM");
}

TEST_F(StepPublisherTest, AVersionPublishedTwiceAtTheFirstTryIsRefused) {
  ASSERT_TRUE(publisher_->Publish(*lora_, model_, 1, 0, nullptr).ok());
  // Only a retry after an outage may find its own commit; a first try found another's.
  EXPECT_TRUE(absl::IsAlreadyExists(publisher_->Publish(*lora_, model_, 1, 0, nullptr)));
}

TEST_F(StepPublisherTest, WaitsUntilTheReplicasTellTheyServeTheVersion) {
  {
    absl::MutexLock lock(&replica_state_.mutex);
    replica_state_.newest_published = 3;
    replica_state_.swap_after_polls = 2;
  }
  EXPECT_TRUE(publisher_->AwaitServed(3).ok());
  absl::MutexLock lock(&replica_state_.mutex);
  EXPECT_EQ(replica_state_.watches, 1);
  EXPECT_EQ(replica_state_.polls, 0);
}

TEST_F(StepPublisherTest, AStoreThatStaysAwayFailsNamingItself) {
  // Nothing listens there, past the outage budget (which the simulated clock passes at once).
  const weight_store::WeightStoreStubs away(
      grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials()));
  StepPublisher publisher({.adapter_name = "policy", .outage = {.budget = absl::Seconds(1)}}, away,
                          {}, cancelled_, clock_);
  const absl::StatusOr<int64_t> newest = publisher.NewestVersion();
  EXPECT_TRUE(absl::IsUnavailable(newest.status())) << newest.status();
  EXPECT_THAT(newest.status().message(), ::testing::HasSubstr("weight-store"));
}

}  // namespace
}  // namespace tandem::trainer
