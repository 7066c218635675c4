#include "services/rollout/client/sample_fan_out.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/rollout/client/sampling_rules.h"
#include "services/rollout/client/testing/fake_rollout.h"

namespace tandem::rollout {
namespace {

using testing::FakeRolloutState;
using testing::FakeRolloutStub;
using ::testing::HasSubstr;

// Prompts [first, end), each naming its index in the whole call.
rollout::v1::GenerateRequest Prompts(int first, int end) {
  rollout::v1::GenerateRequest request;
  for (int p = first; p < end; ++p) request.add_prompts()->set_prompt_id(absl::StrCat(p));
  request.set_group_size(2);
  return request;
}

class SampleFanOutTest : public ::testing::Test {
 protected:
  std::vector<ReplicaStub> Replicas() {
    return {{.address = "replica-a", .stub = &a_stub_}, {.address = "replica-b", .stub = &b_stub_}};
  }

  FakeRolloutState a_, b_;
  FakeRolloutStub a_stub_{a_}, b_stub_{b_};
  SampleFanOut fan_out_;
};

// More prompts than one request may carry: each replica gets a contiguous share, sent as
// requests within the limit, and the samples come back in (prompt, sample) order with indices
// of the whole call.
TEST_F(SampleFanOutTest, SplitsSharesIntoRequestsAndGathersInOrder) {
  const int prompts = 2 * kMaxPromptsPerRequest + 3;
  std::vector<std::pair<int, int>> built;
  absl::Mutex mutex;
  auto responses = fan_out_.Generate(
      Replicas(), {.num_prompts = prompts, .group_size = 2, .request_id_prefix = "job-s1"},
      [&](int first, int end) {
        absl::MutexLock lock(&mutex);
        built.emplace_back(first, end);
        return Prompts(first, end);
      });
  ASSERT_TRUE(responses.ok()) << responses.status();
  ASSERT_EQ(responses->size(), static_cast<size_t>(prompts) * 2);
  for (int p = 0; p < prompts; ++p) {
    for (int s = 0; s < 2; ++s) {
      EXPECT_EQ((*responses)[p * 2 + s].prompt_index(), p);
      EXPECT_EQ((*responses)[p * 2 + s].sample_index(), s);
    }
  }
  EXPECT_EQ(built.size(), 4u) << "two requests per replica's share";
  absl::MutexLock lock(&a_.mutex);
  ASSERT_EQ(a_.requests.size(), 2u);
  // The replica's two requests run at once, so they arrive in either order.
  const auto first = std::find_if(a_.requests.begin(), a_.requests.end(), [](const auto& request) {
    return request.request_id() == "job-s1-r0-c0";
  });
  ASSERT_NE(first, a_.requests.end());
  EXPECT_EQ(first->prompts(0).prompt_id(), "0");
  for (const rollout::v1::GenerateRequest& request : a_.requests) {
    EXPECT_LE(request.prompts_size(), kMaxPromptsPerRequest);
  }
}

TEST_F(SampleFanOutTest, AReplicaThatFailsIsNamedAndADrainingOneIsUnavailable) {
  {
    absl::MutexLock lock(&b_.mutex);
    b_.error_sample = true;
  }
  auto failed = fan_out_.Generate(Replicas(), {.num_prompts = 4, .group_size = 2}, Prompts);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal);
  {
    absl::MutexLock lock(&b_.mutex);
    b_.error_sample = false;
    b_.unavailable_calls = 1;
  }
  auto unavailable = fan_out_.Generate(Replicas(), {.num_prompts = 4, .group_size = 2}, Prompts);
  EXPECT_EQ(unavailable.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(unavailable.status().message(), HasSubstr("rollout replica-b"));
  {
    absl::MutexLock lock(&a_.mutex);
    a_.draining_calls = 1;
  }
  auto draining = fan_out_.Generate(Replicas(), {.num_prompts = 4, .group_size = 2}, Prompts);
  EXPECT_EQ(draining.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(draining.status().message(), HasSubstr("replica-a is draining"));
}

TEST_F(SampleFanOutTest, AnAbandonedFanOutGeneratesNothing) {
  fan_out_.Abandon();
  EXPECT_TRUE(fan_out_.abandoned());
  EXPECT_EQ(
      fan_out_.Generate(Replicas(), {.num_prompts = 2, .group_size = 2}, Prompts).status().code(),
      absl::StatusCode::kCancelled);
  EXPECT_EQ(fan_out_.Generate({}, {.num_prompts = 2}, Prompts).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tandem::rollout
