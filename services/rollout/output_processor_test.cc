// ToGenerateResponse: every field of a sample's message from the scheduler's output.
#include "services/rollout/output_processor.h"

#include <memory>

#include "engine/text/text_codec.h"
#include "engine/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::rollout {
namespace {

using ::testing::ElementsAre;

class OutputProcessorTest : public ::testing::Test {
 protected:
  OutputProcessorTest() : codec_(*engine::text::TextCodecFor("base.safetensors")) {
    work_.request_id = "req-1";
    work_.group_size = 2;
    work_.prompts = {{1, 5, 6}, {1, 7}};
    work_.text_prompts = {false, true};
    work_.codec = codec_.get();
  }

  std::unique_ptr<engine::text::TextCodec> codec_;
  GenerationWork work_;
};

TEST_F(OutputProcessorTest, NamesTheSampleAndCarriesItsTokens) {
  const rollout::v1::GenerateResponse response =
      ToGenerateResponse(work_, {.sample = 1,
                                 .tokens = {9, 10},
                                 .logprobs = {-0.5f, -1.5f},
                                 .finish_reason = engine::FinishReason::kStop,
                                 .adapter_version = 4});
  EXPECT_EQ(response.request_id(), "req-1");
  EXPECT_EQ(response.prompt_index(), 0);
  EXPECT_EQ(response.sample_index(), 1);
  EXPECT_EQ(response.prompt_tokens(), 3);
  EXPECT_THAT(response.token_ids(), ElementsAre(9, 10));
  EXPECT_THAT(response.logprobs(), ElementsAre(-0.5f, -1.5f));
  EXPECT_TRUE(response.token_adapter_versions().empty());
  EXPECT_EQ(response.text(), "") << "a token-id prompt is answered in ids only";
  EXPECT_EQ(response.finish_reason(), rollout::v1::FINISH_REASON_STOP);
  EXPECT_EQ(response.adapter_version(), 4);
  EXPECT_EQ(response.route_status(), rollout::v1::ROUTE_STATUS_NOT_REQUESTED);
  EXPECT_FALSE(response.has_route_key());
}

TEST_F(OutputProcessorTest, ATextPromptIsAnsweredWithTextToo) {
  const rollout::v1::GenerateResponse response = ToGenerateResponse(
      work_, {.sample = 2, .tokens = *engine::Encode("hi"), .token_versions = {3, 4}});
  EXPECT_EQ(response.prompt_index(), 1);
  EXPECT_EQ(response.sample_index(), 0);
  EXPECT_EQ(response.text(), "hi");
  EXPECT_THAT(response.token_adapter_versions(), ElementsAre(3, 4));
}

TEST_F(OutputProcessorTest, RoutesAndErrorsAreReportedAsValidUtf8) {
  const rollout::v1::GenerateResponse response = ToGenerateResponse(
      work_, {.sample = 0,
              .finish_reason = engine::FinishReason::kError,
              .error = "device \xff fault",
              .routes = RouteOutcome::kFailed,
              .route_key =
                  router_replay::RecordKey{
                      .job_id = "job-1", .policy_version = 2, .sample_id = "p0/0", .attempt = 1},
              .route_error = "router-replay \xfe down"});
  EXPECT_EQ(response.finish_reason(), rollout::v1::FINISH_REASON_ERROR);
  EXPECT_EQ(response.error_message(), "device \\xFF fault");
  EXPECT_EQ(response.route_status(), rollout::v1::ROUTE_STATUS_FAILED);
  EXPECT_EQ(response.route_error(), "router-replay \\xFE down");
  EXPECT_EQ(response.route_key().job_id(), "job-1");
  EXPECT_EQ(response.route_key().policy_version(), 2);
  EXPECT_EQ(response.route_key().sample_id(), "p0/0");
  EXPECT_EQ(response.route_key().attempt(), 1);
  EXPECT_EQ(response.route_rows(), 0);
}

TEST_F(OutputProcessorTest, RecordedRoutesCarryTheirRows) {
  const rollout::v1::GenerateResponse response = ToGenerateResponse(
      work_, {.sample = 0,
              .routes = RouteOutcome::kRecorded,
              .route_key = router_replay::RecordKey{.job_id = "job-1", .sample_id = "p0/0"},
              .route_rows = 7});
  EXPECT_EQ(response.route_status(), rollout::v1::ROUTE_STATUS_RECORDED);
  EXPECT_EQ(response.route_rows(), 7);
  EXPECT_EQ(response.route_error(), "");
}

}  // namespace
}  // namespace tandem::rollout
