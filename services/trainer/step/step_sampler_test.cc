// The generation stage of a training step against fake rollout replicas on a simulated clock:
// what it asks each replica for, how it retries, and how it scores what comes back.
#include "services/trainer/step/step_sampler.h"

#include <memory>
#include <set>
#include <vector>

#include "common/testing/simulated_clock.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/rollout/client/testing/fake_rollout.h"

namespace tandem::trainer {
namespace {

using ::testing::ElementsAre;

class StepSamplerTest : public ::testing::Test {
 protected:
  StepSamplerTest() {
    spec_.set_adapter_name("policy");
    spec_.set_prompts_per_step(8);
    spec_.set_group_size(2);
    spec_.set_seed(7);
    spec_.mutable_sampling()->set_max_new_tokens(4);
    codec_ = *engine::text::TextCodecFor("embedded.safetensors");
    task_ = *engine::MakeTask("addition", 1);
  }

  // A sampler for data-parallel rank 1 owning prompt groups 1, 3, 5 and 7, over two replicas.
  StepSampler Sampler(bool record_routes = true) {
    std::vector<rollout::ReplicaStub> replicas = {{.address = "replica-0", .stub = &stubs_[0]},
                                                  {.address = "replica-1", .stub = &stubs_[1]}};
    return StepSampler({.job_id = "job-1",
                        .spec = &spec_,
                        .own_groups = {1, 3, 5, 7},
                        .data_parallel_rank = 1,
                        .record_routes = record_routes,
                        .attempts = 3,
                        .retry_backoff = absl::Milliseconds(500)},
                       task_, codec_, std::move(replicas), fan_out_, clock_);
  }

  std::vector<rollout::v1::GenerateRequest> Requests() {
    std::vector<rollout::v1::GenerateRequest> all;
    for (auto& state : states_) {
      absl::MutexLock lock(&state.mutex);
      all.insert(all.end(), state.requests.begin(), state.requests.end());
    }
    return all;
  }

  trainer::v1::JobSpec spec_;
  std::shared_ptr<const engine::text::TextCodec> codec_;
  std::shared_ptr<const engine::Task> task_;
  rollout::testing::FakeRolloutState states_[2];
  rollout::testing::FakeRolloutStub stubs_[2] = {rollout::testing::FakeRolloutStub(states_[0]),
                                                 rollout::testing::FakeRolloutStub(states_[1])};
  rollout::SampleFanOut fan_out_;
  testing::SimulatedClock clock_;
};

// Each replica gets a contiguous share of this rank's prompts, named by their step-wide groups,
// with the version being trained, the job's sampling, a seed of their own and route recording.
TEST_F(StepSamplerTest, AsksEveryReplicaForItsShareWithTheStepsVersionSeedAndRoutes) {
  absl::StatusOr<StepSamples> samples = Sampler().Generate(/*step=*/3, /*version=*/5);
  ASSERT_TRUE(samples.ok()) << samples.status();
  const std::vector<rollout::v1::GenerateRequest> requests = Requests();
  ASSERT_EQ(requests.size(), 2u);
  std::set<std::string> prompt_ids;
  std::set<uint64_t> seeds;
  for (const rollout::v1::GenerateRequest& request : requests) {
    EXPECT_EQ(request.adapter().adapter_name(), "policy");
    EXPECT_EQ(request.adapter().exact_version(), 5);
    EXPECT_EQ(request.group_size(), 2);
    EXPECT_EQ(request.sampling().max_new_tokens(), 4);
    EXPECT_TRUE(request.routes().enabled());
    EXPECT_EQ(request.routes().job_id(), "job-1");
    EXPECT_EQ(request.routes().attempt(), 0);
    EXPECT_THAT(request.request_id(), ::testing::StartsWith("job-1-s3-v5-d1-a0-"));
    for (const rollout::v1::Prompt& prompt : request.prompts())
      prompt_ids.insert(prompt.prompt_id());
    seeds.insert(request.sampling().seed());
  }
  EXPECT_EQ(prompt_ids, (std::set<std::string>{"s3.p1", "s3.p3", "s3.p5", "s3.p7"}));
  EXPECT_EQ(seeds.size(), 2u) << "each request samples from streams of its own";
  EXPECT_TRUE(seeds.contains(engine::MixSeed(engine::MixSeed(7, 3), 1)));
}

// The fake answers "<eos>" at once: every sample is scored (no addition answered) in prompt-major
// order, each with its step-wide group.
TEST_F(StepSamplerTest, ScoresEverySampleInPromptMajorOrder) {
  absl::StatusOr<StepSamples> samples = Sampler().Generate(1, 1);
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_EQ(samples->training.size(), 8u);
  std::vector<int> groups;
  for (const TrainingSample& sample : samples->training) {
    groups.push_back(sample.group);
    EXPECT_EQ(sample.response, std::vector<int>{engine::kEosId});
    EXPECT_THAT(sample.rollout_logprobs, ElementsAre(-1.0f));
    EXPECT_FALSE(sample.truncated);
  }
  EXPECT_THAT(groups, ElementsAre(1, 1, 3, 3, 5, 5, 7, 7));
  EXPECT_EQ(samples->correct, 0);
  EXPECT_EQ(samples->length, 8);
}

// A replica restarting costs retries with new attempt numbers (new request ids, routes of their
// own), after 0.5 s then 1 s of simulated time; the last attempt's failure is the step's.
TEST_F(StepSamplerTest, AnUnavailableReplicaIsRetriedAsNewAttemptsWithBackoff) {
  {
    absl::MutexLock lock(&states_[0].mutex);
    states_[0].unavailable_calls = 2;
  }
  absl::StatusOr<StepSamples> samples = Sampler().Generate(2, 4);
  ASSERT_TRUE(samples.ok()) << samples.status();
  EXPECT_EQ(samples->training.size(), 8u);
  EXPECT_THAT(clock_.sleeps(), ElementsAre(absl::Milliseconds(500), absl::Seconds(1)));
  std::set<int> attempts;
  for (const rollout::v1::GenerateRequest& request : Requests()) {
    attempts.insert(request.routes().attempt());
  }
  EXPECT_EQ(attempts, (std::set<int>{0, 1, 2}));

  {
    absl::MutexLock lock(&states_[1].mutex);
    states_[1].unavailable_calls = 3;
  }
  samples = Sampler().Generate(3, 4);
  EXPECT_TRUE(absl::IsUnavailable(samples.status())) << samples.status();
}

TEST_F(StepSamplerTest, WithoutRouterReplayNoRoutesAreRecorded) {
  ASSERT_TRUE(Sampler(/*record_routes=*/false).Generate(1, 1).ok());
  for (const rollout::v1::GenerateRequest& request : Requests()) {
    EXPECT_FALSE(request.has_routes());
  }
}

}  // namespace
}  // namespace tandem::trainer
