#include "engine/sampler.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::engine {
namespace {

using ::testing::HasSubstr;

std::vector<double> Softmax(const std::vector<float>& logits, double temperature) {
  std::vector<double> probs(logits.size());
  double sum = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) sum += probs[i] = std::exp(logits[i] / temperature);
  for (double& p : probs) p /= sum;
  return probs;
}

std::vector<double> Frequencies(const std::vector<float>& logits, const SamplingConfig& config,
                                int draws) {
  std::mt19937_64 rng(MixSeed(1234, 0));
  std::vector<double> freq(logits.size(), 0.0);
  for (int i = 0; i < draws; ++i) {
    freq[SampleToken(logits.data(), static_cast<int>(logits.size()), config, rng).token] +=
        1.0 / draws;
  }
  return freq;
}

std::vector<float> RandomLogits(std::mt19937_64& rng, int vocab) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (float& logit : logits) logit = normal(rng);
  return logits;
}

TEST(SamplerTest, GreedyPicksArgmaxAndLowestIdOnTies) {
  const std::vector<float> logits = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f};
  std::mt19937_64 rng(1);
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(SampleToken(logits.data(), 5, {.temperature = 0.0f}, rng).token, 1);
  }
}

TEST(SamplerTest, SameSeedSameTokens) {
  const SamplingConfig config = {.temperature = 1.3f, .top_p = 0.9f, .top_k = 20};
  std::mt19937_64 logit_rng(5);
  std::mt19937_64 first(MixSeed(99, 3));
  std::mt19937_64 second(MixSeed(99, 3));
  for (int i = 0; i < 200; ++i) {
    const std::vector<float> logits = RandomLogits(logit_rng, 49);
    const SampledToken a = SampleToken(logits.data(), 49, config, first);
    const SampledToken b = SampleToken(logits.data(), 49, config, second);
    EXPECT_EQ(a.token, b.token);
    EXPECT_EQ(a.logprob, b.logprob);
  }
}

TEST(SamplerTest, EveryModeConsumesExactlyOneDraw) {
  const std::vector<float> logits = {0.1f, 0.2f, 0.3f};
  for (const SamplingConfig& config :
       {SamplingConfig{.temperature = 0.0f}, SamplingConfig{.top_k = 1},
        SamplingConfig{.top_p = 0.5f}, SamplingConfig{}}) {
    std::mt19937_64 rng(7);
    std::mt19937_64 expected(7);
    SampleToken(logits.data(), 3, config, rng);
    expected.discard(1);
    EXPECT_EQ(rng, expected);
  }
}

TEST(SamplerTest, TopKOneAndTinyTopPEqualGreedy) {
  std::mt19937_64 logit_rng(11);
  std::mt19937_64 rng(12);
  for (int i = 0; i < 200; ++i) {
    const std::vector<float> logits = RandomLogits(logit_rng, 49);
    const int greedy = SampleToken(logits.data(), 49, {.temperature = 0.0f}, rng).token;
    EXPECT_EQ(SampleToken(logits.data(), 49, {.temperature = 2.0f, .top_k = 1}, rng).token, greedy);
    EXPECT_EQ(SampleToken(logits.data(), 49, {.temperature = 2.0f, .top_p = 1e-6f}, rng).token,
              greedy);
  }
}

TEST(SamplerTest, FrequenciesMatchTemperedSoftmax) {
  const std::vector<float> logits = {1.0f, 0.0f, -0.5f, 2.0f, 0.3f};
  constexpr int kDraws = 200000;
  for (const float temperature : {1.0f, 0.7f, 2.5f}) {
    const std::vector<double> expected = Softmax(logits, temperature);
    const std::vector<double> freq = Frequencies(logits, {.temperature = temperature}, kDraws);
    for (size_t i = 0; i < logits.size(); ++i) {
      // Binomial standard deviation is at most 0.0012 here; 0.006 is five of them.
      EXPECT_NEAR(freq[i], expected[i], 0.006) << "T=" << temperature << " token " << i;
    }
  }
}

TEST(SamplerTest, TopKRenormalizesOverTheKMostLikely) {
  const std::vector<float> logits = {1.0f, 0.0f, -0.5f, 2.0f, 0.3f};
  const std::vector<double> freq = Frequencies(logits, {.top_k = 2}, 100000);
  const double p3 = 1.0 / (1.0 + std::exp(-1.0));
  EXPECT_NEAR(freq[3], p3, 0.006);
  EXPECT_NEAR(freq[0], 1.0 - p3, 0.006);
  EXPECT_EQ(freq[1] + freq[2] + freq[4], 0.0);
}

TEST(SamplerTest, TopPKeepsTheSmallestPrefixReachingP) {
  const std::vector<float> logits = {std::log(0.15f), std::log(0.5f), std::log(0.05f),
                                     std::log(0.3f)};
  // 0.5 < 0.7 <= 0.5 + 0.3: tokens 1 and 3 remain, in proportion 5:3.
  const std::vector<double> freq = Frequencies(logits, {.top_p = 0.7f}, 100000);
  EXPECT_NEAR(freq[1], 0.625, 0.006);
  EXPECT_NEAR(freq[3], 0.375, 0.006);
  EXPECT_EQ(freq[0] + freq[2], 0.0);
}

TEST(SamplerTest, MaskedTokensAreNeverDrawn) {
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  const std::vector<float> logits = {kMasked, 0.0f, kMasked, 0.0f};
  const std::vector<double> freq = Frequencies(logits, {.temperature = 5.0f}, 20000);
  EXPECT_EQ(freq[0] + freq[2], 0.0);
  EXPECT_NEAR(freq[1], 0.5, 0.02);
}

TEST(SamplerTest, LogprobIsTheTemperedUntruncatedLogSoftmax) {
  std::mt19937_64 logit_rng(21);
  std::mt19937_64 rng(22);
  for (const SamplingConfig& config : {SamplingConfig{}, SamplingConfig{.temperature = 0.0f},
                                       SamplingConfig{.temperature = 0.3f, .top_k = 3},
                                       SamplingConfig{.temperature = 3.0f, .top_p = 0.5f}}) {
    for (int i = 0; i < 50; ++i) {
      const std::vector<float> logits = RandomLogits(logit_rng, 49);
      const std::vector<double> probs =
          Softmax(logits, config.temperature > 0 ? config.temperature : 1.0);
      const SampledToken sampled = SampleToken(logits.data(), 49, config, rng);
      EXPECT_NEAR(sampled.logprob, std::log(probs[sampled.token]), 1e-5);
    }
  }
}

TEST(SamplerTest, ValidateAcceptsTheRangeEnds) {
  EXPECT_TRUE(Validate({}).ok());
  EXPECT_TRUE(Validate({.temperature = 0.0f, .top_p = 1e-9f, .top_k = 0}).ok());
  EXPECT_TRUE(Validate({.temperature = 100.0f, .top_p = 1.0f, .top_k = 1000}).ok());
}

TEST(SamplerTest, ValidateNamesFieldAndValue) {
  struct Case {
    SamplingConfig config;
    const char* message;
  };
  for (const Case& c : {Case{{.temperature = -0.5f}, "temperature = -0.5"},
                        Case{{.temperature = 101.0f}, "temperature = 101"},
                        Case{{.temperature = std::nanf("")}, "temperature = nan"},
                        Case{{.top_p = 0.0f}, "top_p = 0"}, Case{{.top_p = 1.5f}, "top_p = 1.5"},
                        Case{{.top_k = -1}, "top_k = -1"}}) {
    const absl::Status status = Validate(c.config);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
}

TEST(MixSeedTest, IsSplitMix64AndSeparatesStreams) {
  // splitmix64's first output from state 0 (reference implementation by S. Vigna).
  EXPECT_EQ(MixSeed(0, 0), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(MixSeed(42, 7), 2820384354626331986ULL);
  EXPECT_NE(MixSeed(1, 0), MixSeed(1, 1));
  EXPECT_NE(MixSeed(1, 0), MixSeed(0, 1));
}

}  // namespace
}  // namespace tandem::engine
