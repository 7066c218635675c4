// TrainingState on real files and a real Gloo group: where a run's state comes from, what a
// checkpoint of it restores, what it refuses, and rank 0's state reaching the other ranks.
#include "services/trainer/job/training_state.h"

#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "common/gloo_communicator.h"
#include "engine/testing/test_models.h"
#include "gloo/rendezvous/hash_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/trainer/api/job_spec_testing.h"

namespace tandem::trainer {
namespace {

using ::testing::HasSubstr;

JobModel SmallModel() {
  return {.base = std::make_unique<engine::BaseModel>(
              *engine::BaseModel::Create(engine::test_models::TinyConfig(), 3))};
}

JobPlan PlanFor(trainer::v1::Algorithm algorithm, int64_t seed = 1) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.set_algorithm(algorithm);
  spec.set_seed(seed);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, "job-1", "/unused");
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

std::unique_ptr<TrainingState> Create(const JobPlan& plan, StateOrigin origin = {}) {
  auto state = TrainingState::Create(plan, SmallModel(), std::move(origin));
  EXPECT_TRUE(state.ok()) << state.status();
  return state.ok() ? *std::move(state) : nullptr;
}

// Every LoRA value, in name order.
std::vector<float> Values(const engine::LoraAdapter& lora) {
  std::vector<float> all;
  for (const std::string& name : lora.parameters().names()) {
    const std::vector<float>& values = lora.parameters().Find(name)->value;
    all.insert(all.end(), values.begin(), values.end());
  }
  return all;
}

class TrainingStateTest : public ::testing::Test {
 protected:
  std::string Dir() { return ::testing::TempDir() + "/" + test_info_->name(); }
  const ::testing::TestInfo* test_info_ = ::testing::UnitTest::GetInstance()->current_test_info();
};

TEST_F(TrainingStateTest, ANewAdapterStartsWithBZeroAndASeededA) {
  std::unique_ptr<TrainingState> state = Create(PlanFor(trainer::v1::ALGORITHM_GRPO, 5));
  ASSERT_NE(state, nullptr);
  double a_norm = 0, b_norm = 0;
  for (const std::string& name : state->lora().parameters().names()) {
    for (float v : state->lora().parameters().Find(name)->value) {
      (name.find("lora_B") != std::string::npos ? b_norm : a_norm) += v * v;
    }
  }
  EXPECT_GT(a_norm, 0);
  EXPECT_EQ(b_norm, 0);
  EXPECT_EQ(Values(Create(PlanFor(trainer::v1::ALGORITHM_GRPO, 5))->lora()), Values(state->lora()));
  EXPECT_NE(Values(Create(PlanFor(trainer::v1::ALGORITHM_GRPO, 6))->lora()), Values(state->lora()));
}

TEST_F(TrainingStateTest, OnlyPpoPointsTheUpdaterAtACritic) {
  const JobPlan grpo = PlanFor(trainer::v1::ALGORITHM_GRPO);
  EXPECT_EQ(Create(grpo)->UpdateConfig(grpo, nullptr).critic.head, nullptr);
  const JobPlan ppo = PlanFor(trainer::v1::ALGORITHM_PPO);
  std::unique_ptr<TrainingState> state = Create(ppo);
  const PolicyUpdateConfig config = state->UpdateConfig(ppo, nullptr);
  EXPECT_NE(config.critic.head, nullptr);
  EXPECT_NE(config.critic.optimizer, nullptr);
  EXPECT_EQ(config.critic.learning_rate, ppo.update.critic.learning_rate);
}

TEST_F(TrainingStateTest, ACheckpointRestoresTheAdapterTheOptimizerAndTheCritic) {
  const JobPlan plan = PlanFor(trainer::v1::ALGORITHM_PPO, 9);
  std::unique_ptr<TrainingState> saved = Create(plan);
  ASSERT_TRUE(saved->SaveCheckpoint(Dir(), {.job_id = "job-1"}, 3, 4).ok());
  auto checkpoint = LoadCheckpoint(Dir(), engine::test_models::TinyConfig());
  ASSERT_TRUE(checkpoint.ok() && checkpoint->has_value()) << checkpoint.status();
  ASSERT_TRUE((*checkpoint)->critic.has_value());
  // Another seed: a restored state must not be a fresh one.
  std::unique_ptr<TrainingState> restored = Create(
      PlanFor(trainer::v1::ALGORITHM_PPO, 10),
      {.checkpoint = *std::move(*checkpoint), .resuming = true, .read_initial_adapter = true});
  ASSERT_NE(restored, nullptr);
  EXPECT_EQ(Values(restored->lora()), Values(saved->lora()));
}

TEST_F(TrainingStateTest, APpoResumeWithoutAValueHeadIsDataLoss) {
  const JobPlan grpo = PlanFor(trainer::v1::ALGORITHM_GRPO);
  ASSERT_TRUE(Create(grpo)->SaveCheckpoint(Dir(), {.job_id = "job-1"}, 3, 4).ok());
  auto checkpoint = LoadCheckpoint(Dir(), engine::test_models::TinyConfig());
  ASSERT_TRUE(checkpoint.ok() && checkpoint->has_value());
  auto resumed = TrainingState::Create(PlanFor(trainer::v1::ALGORITHM_PPO), SmallModel(),
                                       {.checkpoint = **checkpoint, .resuming = true});
  EXPECT_EQ(resumed.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(resumed.status().message(), HasSubstr("no value head"));
  // Starting a new PPO job from it trains a fresh head instead.
  EXPECT_TRUE(TrainingState::Create(PlanFor(trainer::v1::ALGORITHM_PPO), SmallModel(),
                                    {.checkpoint = **checkpoint, .resuming = false})
                  .ok());
}

TEST_F(TrainingStateTest, AMissingInitialAdapterFailsNamingIt) {
  JobPlan plan = PlanFor(trainer::v1::ALGORITHM_GRPO);
  plan.spec.set_initial_adapter_path(Dir() + "/no-such-adapter");
  auto state = TrainingState::Create(plan, SmallModel(), {});
  EXPECT_EQ(state.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(state.status().message(), HasSubstr("initial adapter"));
  // A rank > 0 reads no file: its values come from rank 0.
  EXPECT_TRUE(TrainingState::Create(plan, SmallModel(), {.read_initial_adapter = false}).ok());
}

TEST_F(TrainingStateTest, NonFiniteValuesFailTheStepNamingWhat) {
  std::unique_ptr<TrainingState> state = Create(PlanFor(trainer::v1::ALGORITHM_GRPO));
  EXPECT_TRUE(state->CheckFinite(1, {.loss = 0.5, .grad_norm = 1}).ok());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(state->CheckFinite(2, {.loss = nan}).message(), HasSubstr("step 2: loss nan"));
  const std::string name = state->lora().parameters().names().front();
  state->lora().parameters().Find(name)->value[0] = std::numeric_limits<float>::infinity();
  const absl::Status status = state->CheckFinite(3, {});
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr(name));
}

TEST_F(TrainingStateTest, BroadcastGivesEveryRankRankZerosState) {
  const JobPlan plan = PlanFor(trainer::v1::ALGORITHM_PPO);
  std::vector<std::unique_ptr<TrainingState>> states;
  states.push_back(Create(PlanFor(trainer::v1::ALGORITHM_PPO, 1)));
  states.push_back(Create(PlanFor(trainer::v1::ALGORITHM_PPO, 2)));
  ASSERT_NE(Values(states[0]->lora()), Values(states[1]->lora()));
  gloo::rendezvous::HashStore store;
  std::vector<absl::Status> results(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      auto ranks = GlooCommunicator::Create(store, rank, 2, {});
      results[rank] = ranks.ok() ? states[rank]->Broadcast(**ranks) : ranks.status();
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const absl::Status& status : results) EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(Values(states[1]->lora()), Values(states[0]->lora()));
}

}  // namespace
}  // namespace tandem::trainer
