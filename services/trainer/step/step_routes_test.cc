#include "services/trainer/step/step_routes.h"

#include "engine/config.h"
#include "gtest/gtest.h"
#include "services/router_replay/client/testing/fake_route_source.h"

namespace tandem::trainer {
namespace {

// A sample as rollout returns it: prompt and generated tokens, and the record its routes are in.
rollout::v1::GenerateResponse Sample(const std::string& sample_id, int prompt, int generated,
                                     int attempt) {
  rollout::v1::GenerateResponse response;
  response.set_prompt_tokens(prompt);
  for (int i = 0; i < generated; ++i) response.add_token_ids(5);
  response.mutable_route_key()->set_job_id("job-1");
  response.mutable_route_key()->set_policy_version(4);
  response.mutable_route_key()->set_sample_id(sample_id);
  response.mutable_route_key()->set_attempt(attempt);
  return response;
}

TEST(StepRoutesTest, AsksForEverySampleByItsRecordKeyAndCountsTheEntries) {
  StepSamples samples;
  samples.responses = {Sample("s1.p0/0", 3, 2, 0), Sample("s1.p0/1", 3, 4, 1)};
  router_replay::testing::FakeRouteSource source;
  source.Answer(/*fill=*/2, /*missing_entries=*/5);
  const engine::ModelConfig model = engine::DefaultModelConfig();
  absl::StatusOr<StepRoutes> routes = FetchStepRoutes(source, samples, model, absl::Seconds(30));
  ASSERT_TRUE(routes.ok()) << routes.status();

  const std::vector<router_replay::testing::FakeRouteSource::Call> calls = source.calls();
  ASSERT_EQ(calls.size(), 1u);
  const router_replay::testing::FakeRouteSource::Call& call = calls[0];
  ASSERT_EQ(call.sequences.size(), 2u);
  EXPECT_EQ(call.sequences[1].key.sample_id, "s1.p0/1");
  EXPECT_EQ(call.sequences[1].key.policy_version, 4);
  EXPECT_EQ(call.sequences[1].key.attempt, 1) << "a retried step's routes are its own";
  EXPECT_EQ(call.sequences[1].num_tokens, 7);
  EXPECT_TRUE(call.options.allow_partial) << "a missing record is routed live, not fatal";
  EXPECT_EQ(call.options.moe_layers, model.MoeLayerIndices());
  EXPECT_EQ(call.options.top_k, model.top_k);
  EXPECT_EQ(call.options.timeout, absl::Seconds(30));

  const int64_t ids_per_row = model.num_moe_layers() * model.top_k;
  EXPECT_EQ(static_cast<int64_t>(routes->routes.size()), (5 + 7) * ids_per_row);
  EXPECT_EQ(routes->entries, (4 + 6) * model.num_moe_layers());
  EXPECT_EQ(routes->missing_entries, 5);
}

TEST(StepRoutesTest, AFailedFetchIsTheStepsError) {
  StepSamples samples;
  samples.responses = {Sample("s1.p0/0", 3, 2, 0)};
  router_replay::testing::FakeRouteSource source;
  source.Fail(absl::UnavailableError("router-replay restarting"));
  const absl::StatusOr<StepRoutes> routes =
      FetchStepRoutes(source, samples, engine::DefaultModelConfig(), absl::Seconds(30));
  EXPECT_TRUE(absl::IsUnavailable(routes.status())) << routes.status();
}

}  // namespace
}  // namespace tandem::trainer
