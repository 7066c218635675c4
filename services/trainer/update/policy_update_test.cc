// PolicyUpdater on the real engine: GRPO updates raise the reward of a toy task, R3 replay of
// the generator's own routes agrees exactly, and mismatch statistics see a perturbed rollout.
#include "services/trainer/update/policy_update.h"

#include <cmath>
#include <random>

#include "engine/cpu_model_ops.h"
#include "engine/generator.h"
#include "engine/sampler.h"
#include "gtest/gtest.h"

namespace tandem::trainer {
namespace {

engine::ModelConfig SmallConfig() {
  engine::ModelConfig config;
  config.vocab_size = 12;
  config.d_model = 16;
  config.num_heads = 2;
  config.num_layers = 2;
  config.num_dense_layers = 1;
  config.dense_ffn_dim = 16;
  config.num_experts = 4;
  config.top_k = 2;
  config.expert_ffn_dim = 8;
  config.max_seq_len = 16;
  return config;
}

// Weights larger than the default init, so the frozen LM head lets LoRA move the outputs.
engine::BaseModel LoudModel() {
  engine::BaseModel model = *engine::BaseModel::Create(SmallConfig(), 3);
  std::mt19937_64 rng(4);
  for (const std::string& name : model.parameters().names()) {
    if (name.ends_with("norm.weight")) continue;
    engine::ParameterSet::FillNormal(*model.parameters().Find(name), 0.3f, rng);
  }
  return model;
}

class PolicyUpdateTest : public ::testing::Test {
 protected:
  PolicyUpdateTest()
      : base_(LoudModel()),
        lora_(*engine::LoraAdapter::Create(SmallConfig(), engine::LoraConfig{.rank = 4}, 4)) {
    lora_.parameters().EnableGradients();
    optimizer_.emplace(
        *engine::AdamW::Create({.weight_decay = 0}, engine::OptimizerParams(lora_.parameters())));
  }

  // `groups` prompts x 8 samples of 3 tokens; reward 1 when the first token is kTarget.
  std::vector<TrainingSample> Rollouts(int groups, uint64_t seed, std::vector<int16_t>* routes,
                                       float temperature = 1.0f) {
    engine::Transformer transformer(base_, &lora_,
                                    std::make_unique<engine::CpuModelOps>(base_.config()));
    std::vector<engine::GenerationRequest> requests;
    for (int g = 0; g < groups; ++g) {
      for (int j = 0; j < 8; ++j) {
        engine::GenerationRequest& request = requests.emplace_back();
        request.prompt = {1, 3 + g % 5};
        request.max_new_tokens = 3;
        request.sampling.temperature = temperature;
        request.seed = engine::MixSeed(seed, g * 8 + j);
      }
    }
    std::vector<TrainingSample> samples;
    for (size_t i = 0; i < requests.size(); ++i) {
      engine::GeneratedSample generated =
          std::move((*engine::Generate(transformer, {requests[i]}))[0]);
      TrainingSample& sample = samples.emplace_back();
      sample.prompt = requests[i].prompt;
      sample.response.assign(generated.tokens.begin() + generated.prompt_length,
                             generated.tokens.end());
      sample.rollout_logprobs = generated.logprobs;
      sample.group = static_cast<int>(i / 8);
      sample.reward = sample.response[0] == kTarget;
      if (routes != nullptr) {
        routes->insert(routes->end(), generated.routes.begin(), generated.routes.end());
        // The last token is never forwarded: -1 (routed live), as FetchReplayRoutes fills it.
        routes->insert(routes->end(), 2 * 1, -1);
      }
    }
    return samples;
  }

  double MeanReward(const std::vector<TrainingSample>& samples) {
    double sum = 0;
    for (const TrainingSample& sample : samples) sum += sample.reward;
    return sum / samples.size();
  }

  static constexpr int kTarget = 7;
  engine::BaseModel base_;
  engine::LoraAdapter lora_;
  std::optional<engine::AdamW> optimizer_;
};

TEST_F(PolicyUpdateTest, GrpoRaisesTheRewardWithR3Replay) {
  PolicyUpdater updater(
      base_, lora_, *optimizer_,
      {.replay = RouteReplay::kR3, .schedule = engine::ScheduleConfig::Constant(1e-2f)});
  const double before = MeanReward(Rollouts(8, 999, nullptr));
  for (int step = 0; step < 12; ++step) {
    std::vector<int16_t> routes;
    const std::vector<TrainingSample> samples = Rollouts(8, step, &routes);
    auto stats = updater.Update(samples, routes);
    ASSERT_TRUE(stats.ok()) << stats.status();
    // Replaying the generator's own fp32 routes: the trainer's routing agrees everywhere, and
    // the trainer's log-probs are the rollout's (no mismatch).
    EXPECT_GT(stats->routing.decisions, 0);
    EXPECT_EQ(stats->routing.differing_decisions, 0);
    EXPECT_LT(stats->mismatch_kl_k3, 1e-6);
    EXPECT_EQ(stats->large_mismatch_share, 0);
    EXPECT_TRUE(std::isfinite(stats->grad_norm));
  }
  const double after = MeanReward(Rollouts(8, 999, nullptr));
  std::printf("reward %.3f -> %.3f\n", before, after);
  EXPECT_GT(after, before + 0.3);
}

TEST_F(PolicyUpdateTest, PpoWithAValueHeadRaisesTheReward) {
  ValueHead head(SmallConfig().d_model);
  engine::AdamW head_optimizer =
      *engine::AdamW::Create({.weight_decay = 0}, head.OptimizerParams());
  PolicyUpdater updater(base_, lora_, *optimizer_,
                        {.critic = {.head = &head,
                                    .optimizer = &head_optimizer,
                                    .learning_rate = 0.05f,
                                    .gamma = 1.0,
                                    .lambda = 0.95},
                         .whiten_advantages = true,
                         .schedule = engine::ScheduleConfig::Constant(1e-2f)});
  const double before = MeanReward(Rollouts(8, 999, nullptr));
  for (int step = 0; step < 12; ++step) {
    std::vector<int16_t> routes;
    std::vector<TrainingSample> samples = Rollouts(8, step, &routes);
    for (size_t i = 0; i < samples.size(); ++i) samples[i].group = static_cast<int>(i);
    auto stats = updater.Update(samples, routes);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_TRUE(std::isfinite(stats->value_loss) && std::isfinite(stats->grad_norm));
  }
  const double after = MeanReward(Rollouts(8, 999, nullptr));
  std::printf("reward %.3f -> %.3f\n", before, after);
  EXPECT_GT(after, before + 0.3);
}

// The least value loss a linear head can reach on fixed features: 0.5 * mean((w.h + b - R)^2)
// at the least-squares w, b (normal equations, Gaussian elimination).
double LeastSquaresValueLoss(const std::vector<std::vector<double>>& features,
                             const std::vector<double>& returns) {
  const size_t n = features[0].size() + 1;  // w and b.
  std::vector<std::vector<double>> system(n, std::vector<double>(n + 1, 0));
  for (size_t r = 0; r < features.size(); ++r) {
    std::vector<double> x = features[r];
    x.push_back(1);
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < n; ++j) system[i][j] += x[i] * x[j];
      system[i][n] += x[i] * returns[r];
    }
  }
  for (size_t i = 0; i < n; ++i) system[i][i] += 1e-9;  // Keeps it regular.
  for (size_t col = 0; col < n; ++col) {
    size_t pivot = col;
    for (size_t r = col + 1; r < n; ++r) {
      if (std::abs(system[r][col]) > std::abs(system[pivot][col])) pivot = r;
    }
    std::swap(system[col], system[pivot]);
    for (size_t r = 0; r < n; ++r) {
      if (r == col) continue;
      const double factor = system[r][col] / system[col][col];
      for (size_t c = col; c <= n; ++c) system[r][c] -= factor * system[col][c];
    }
  }
  double loss = 0;
  for (size_t r = 0; r < features.size(); ++r) {
    double value = system[n - 1][n] / system[n - 1][n - 1];
    for (size_t i = 0; i + 1 < n; ++i) value += features[r][i] * system[i][n] / system[i][i];
    loss += 0.5 * (value - returns[r]) * (value - returns[r]);
  }
  return loss / features.size();
}

// With the trunk frozen (the LoRA's learning rate 0) and one fixed batch, whose returns
// stay the scores (gamma = lambda = 1), the value loss must fall to what the best linear head on
// those hidden states reaches.
TEST_F(PolicyUpdateTest, TheValueHeadConvergesToTheBestLinearFitOfTheReturns) {
  ValueHead head(SmallConfig().d_model);
  engine::AdamW head_optimizer =
      *engine::AdamW::Create({.weight_decay = 0}, head.OptimizerParams());
  PolicyUpdater updater(
      base_, lora_, *optimizer_,
      {.critic = {.head = &head, .optimizer = &head_optimizer, .learning_rate = 1e-2f},
       .whiten_advantages = true,
       .schedule = engine::ScheduleConfig::Constant(0)});
  std::vector<int16_t> routes;
  const std::vector<TrainingSample> samples = Rollouts(8, 5, &routes);
  ASSERT_GT(MeanReward(samples), 0);
  ASSERT_LT(MeanReward(samples), 1);
  // The hidden state that predicts each response token, and its return.
  std::vector<std::vector<double>> features;
  std::vector<double> returns;
  engine::Transformer trunk(base_, &lora_, std::make_unique<engine::CpuModelOps>(base_.config()));
  const int d = SmallConfig().d_model;
  for (const TrainingSample& sample : samples) {
    engine::TokenBatch batch;
    std::vector<int> sequence = sample.prompt;
    sequence.insert(sequence.end(), sample.response.begin(), sample.response.end());
    batch.Add(sequence);
    ASSERT_TRUE(trunk.Forward(batch, nullptr).ok());
    for (size_t t = 0; t < sample.response.size(); ++t) {
      const float* row = trunk.final_hidden().data() + (sample.prompt.size() - 1 + t) * d;
      features.emplace_back(row, row + d);
      returns.push_back(sample.reward);
    }
  }
  const double best = LeastSquaresValueLoss(features, returns);
  std::vector<double> value_loss, explained;
  for (int update = 0; update < 100; ++update) {
    auto stats = updater.Update(samples, routes);
    ASSERT_TRUE(stats.ok()) << stats.status();
    value_loss.push_back(stats->value_loss);
    explained.push_back(stats->explained_variance);
  }
  std::printf("value loss %.5f -> %.5f (best linear fit %.5f), explained variance %.3f -> %.3f\n",
              value_loss.front(), value_loss.back(), best, explained.front(), explained.back());
  EXPECT_EQ(explained.front(), 0);  // The head starts at zero: V = 0 explains nothing.
  EXPECT_GT(explained.back(), 0);
  EXPECT_LT(value_loss.back(), best * 1.05);
  EXPECT_LT(value_loss.back(), value_loss.front() * 0.9);
}

TEST_F(PolicyUpdateTest, SeveralUpdatesPerStepAndMismatchStatistics) {
  PolicyUpdater updater(base_, lora_, *optimizer_,
                        {.is = {.mode = IsMode::kTokenTis, .upper = 1.5},
                         .replay = RouteReplay::kR2,
                         .updates_per_step = 2,
                         .micro_batch_size = 3,
                         .schedule = engine::ScheduleConfig::Constant(1e-2f)});
  std::vector<TrainingSample> samples = Rollouts(4, 1, nullptr);
  for (TrainingSample& sample : samples) {
    for (float& logp : sample.rollout_logprobs) logp -= 0.7f;  // A rollout that disagrees.
  }
  auto stats = updater.Update(samples, {});
  ASSERT_TRUE(stats.ok()) << stats.status();
  // log rho = +0.7 everywhere: k3 = e^0.7 - 1 - 0.7, and every weight exp(0.7) > 1.5 clips.
  EXPECT_NEAR(stats->mismatch_kl_k3, std::exp(0.7) - 1.7, 1e-4);
  EXPECT_EQ(stats->large_mismatch_share, 0);  // |log rho| = 0.7 is within the factor e.
  EXPECT_NEAR(stats->is_clipped_share, 1.0, 1e-9);
  EXPECT_NEAR(stats->is_ess, 1.0, 1e-9);
  EXPECT_EQ(stats->response_tokens, 32 * 3);
}

TEST_F(PolicyUpdateTest, LargeMismatchShareCountsTokensOffByMoreThanAFactorE) {
  PolicyUpdater updater(base_, lora_, *optimizer_,
                        {.schedule = engine::ScheduleConfig::Constant(0)});
  std::vector<TrainingSample> samples = Rollouts(4, 1, nullptr);
  // Of every four samples, rollout log-probs 1.2 below the trainer's in two and 1.2 above in one
  // count (both directions); 0.9 below, within a factor e, does not.
  const float shifts[] = {-1.2f, -1.2f, 1.2f, -0.9f};
  for (size_t i = 0; i < samples.size(); ++i) {
    for (float& logp : samples[i].rollout_logprobs) logp += shifts[i % 4];
  }
  auto stats = updater.Update(samples, {});
  ASSERT_TRUE(stats.ok()) << stats.status();
  int64_t large = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    if (i % 4 < 3) large += static_cast<int64_t>(samples[i].response.size());
  }
  EXPECT_NEAR(stats->large_mismatch_share, static_cast<double>(large) / stats->response_tokens,
              1e-12);
  EXPECT_GT(stats->large_mismatch_share, 0);
  EXPECT_LT(stats->large_mismatch_share, 1);
}

TEST_F(PolicyUpdateTest, LogProbsAreOfTheSamplingTemperatureLikeTheRollouts) {
  for (float temperature : {0.5f, 1.0f, 2.0f}) {
    PolicyUpdater updater(
        base_, lora_, *optimizer_,
        {.schedule = engine::ScheduleConfig::Constant(0), .temperature = temperature});
    auto stats = updater.Update(Rollouts(2, 3, nullptr, temperature), {});
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_LT(stats->mismatch_kl_k3, 1e-8) << "temperature " << temperature;
  }
  PolicyUpdater untempered(base_, lora_, *optimizer_,
                           {.schedule = engine::ScheduleConfig::Constant(0)});
  EXPECT_GT(untempered.Update(Rollouts(2, 3, nullptr, 0.5f), {})->mismatch_kl_k3, 1e-3);
}

TEST_F(PolicyUpdateTest, R2WithOneUpdateReplaysNothingButItsOwnLiveRoutes) {
  // One update per step fuses the old-policy pass into the update pass: the routes R2 would
  // replay are the live routes of that same forward, over many micro-batches.
  PolicyUpdater updater(base_, lora_, *optimizer_,
                        {.replay = RouteReplay::kR2,
                         .micro_batch_size = 3,
                         .schedule = engine::ScheduleConfig::Constant(1e-3f)});
  auto stats = updater.Update(Rollouts(4, 1, nullptr), {});
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(std::isfinite(stats->loss));
}

TEST_F(PolicyUpdateTest, InconsistentInputsAreRejected) {
  PolicyUpdater updater(base_, lora_, *optimizer_, {});
  std::vector<TrainingSample> samples = Rollouts(1, 1, nullptr);
  samples[0].rollout_logprobs.pop_back();
  EXPECT_EQ(updater.Update(samples, {}).status().code(), absl::StatusCode::kInvalidArgument);
  samples = Rollouts(1, 1, nullptr);
  EXPECT_EQ(updater.Update(samples, std::vector<int16_t>(5, 0)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::trainer
