// PlanJob: the typed plan a resolved spec maps to. Unset fields take the typed configuration's
// own defaults; every set field reaches the plan.
#include "services/trainer/job/job_plan.h"

#include "gtest/gtest.h"
#include "services/trainer/api/job_spec_testing.h"

namespace tandem::trainer {
namespace {

JobPlan Plan(const trainer::v1::JobSpec& spec) {
  absl::StatusOr<JobPlan> plan = PlanJob(spec, "job-1", "/out/job-1");
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *std::move(plan) : JobPlan{};
}

TEST(JobPlanTest, UnsetFieldsTakeThePolicyUpdatersDefaults) {
  const JobPlan plan = Plan(MinimalValidSpec());
  const PolicyUpdateConfig defaults;
  EXPECT_EQ(plan.update.micro_batch_size, defaults.micro_batch_size);
  EXPECT_EQ(plan.update.updates_per_step, defaults.updates_per_step);
  EXPECT_EQ(plan.update.max_grad_norm, defaults.max_grad_norm);
  EXPECT_EQ(plan.update.loss.clip_low, defaults.loss.clip_low);
  EXPECT_EQ(plan.update.loss.clip_high, defaults.loss.clip_high);
  EXPECT_EQ(plan.update.loss.dual_clip_c, defaults.loss.dual_clip_c);
  EXPECT_EQ(plan.update.loss.kl_estimator, defaults.loss.kl_estimator);
  EXPECT_EQ(plan.update.loss.aggregation, defaults.loss.aggregation);
  EXPECT_EQ(plan.update.is.mode, IsMode::kNone);
  EXPECT_EQ(plan.update.is.upper, defaults.is.upper);
  EXPECT_EQ(plan.update.is.lower, defaults.is.lower);
  EXPECT_EQ(plan.update.critic.gamma, defaults.critic.gamma);
  EXPECT_EQ(plan.update.critic.lambda, defaults.critic.lambda);
  EXPECT_EQ(plan.update.critic.loss_coef, defaults.critic.loss_coef);
  EXPECT_EQ(plan.update.critic.value_clip, defaults.critic.value_clip);
  EXPECT_EQ(plan.update.replay, RouteReplay::kR3);
  EXPECT_EQ(plan.update.baseline, GroupBaseline::kGrpo);
  EXPECT_FALSE(plan.update.whiten_advantages);
  EXPECT_FALSE(plan.trains_critic);
  EXPECT_EQ(plan.data_parallel, 1);
  EXPECT_EQ(plan.lookahead, 0);
  EXPECT_EQ(plan.update.schedule.decay, engine::LrDecay::kConstant);
  EXPECT_FLOAT_EQ(plan.update.schedule.peak_lr, 1e-3f);
  EXPECT_EQ(plan.update.schedule.total_steps, 10);
  EXPECT_FLOAT_EQ(plan.update.temperature, 1.0f);
}

TEST(JobPlanTest, EverySetFieldReachesThePlan) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.set_algorithm(trainer::v1::ALGORITHM_DR_GRPO);
  spec.set_micro_batch_size(3);
  spec.set_routing_replay(trainer::v1::ROUTING_REPLAY_MODE_R2);
  spec.mutable_sampling()->set_temperature(0.5f);
  spec.set_sync_mode(trainer::v1::SYNC_MODE_ASYNC);
  spec.set_max_staleness(3);
  spec.mutable_parallelism()->set_data_parallel(2);
  trainer::v1::AlgorithmConfig& algorithm = *spec.mutable_algorithm_config();
  algorithm.set_weight_decay(0.05);
  algorithm.set_max_grad_norm(0.5);
  algorithm.set_clip_eps_low(0.1);
  algorithm.set_clip_eps_high(0.28);
  algorithm.set_dual_clip_c(0);
  algorithm.set_kl_coef(0.01);
  algorithm.set_kl_estimator(trainer::v1::KL_ESTIMATOR_K2);
  algorithm.set_loss_aggregation(trainer::v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_SUM);
  algorithm.set_updates_per_step(2);
  algorithm.mutable_lr_schedule()->set_decay(trainer::v1::LR_DECAY_COSINE);
  algorithm.mutable_lr_schedule()->set_warmup_updates(4);
  algorithm.mutable_lr_schedule()->set_min_lr_ratio(0.1);
  spec.mutable_is_correction()->set_mode(trainer::v1::IS_CORRECTION_MODE_REJECTION);
  spec.mutable_is_correction()->set_rejection_level(trainer::v1::REJECTION_LEVEL_SEQUENCE);
  spec.mutable_is_correction()->set_upper_bound(3);
  spec.mutable_is_correction()->set_lower_bound(0.25);

  const JobPlan plan = Plan(spec);
  EXPECT_EQ(plan.update.baseline, GroupBaseline::kDrGrpo);
  EXPECT_EQ(plan.update.micro_batch_size, 3);
  EXPECT_EQ(plan.update.replay, RouteReplay::kR2);
  EXPECT_FLOAT_EQ(plan.update.temperature, 0.5f);
  EXPECT_EQ(plan.lookahead, 3);
  EXPECT_EQ(plan.data_parallel, 2);
  EXPECT_FLOAT_EQ(plan.adamw.weight_decay, 0.05f);
  EXPECT_FLOAT_EQ(plan.update.max_grad_norm, 0.5f);
  EXPECT_EQ(plan.update.loss.clip_low, 0.1);
  EXPECT_EQ(plan.update.loss.clip_high, 0.28);
  EXPECT_EQ(plan.update.loss.dual_clip_c, 0);
  EXPECT_EQ(plan.update.loss.kl_coef, 0.01);
  EXPECT_EQ(plan.update.loss.kl_estimator, KlEstimator::kK2);
  EXPECT_EQ(plan.update.loss.aggregation, Aggregation::kSeqMeanTokenSum);
  EXPECT_EQ(plan.update.updates_per_step, 2);
  EXPECT_EQ(plan.update.schedule.decay, engine::LrDecay::kCosine);
  EXPECT_EQ(plan.update.schedule.warmup_steps, 4);
  EXPECT_FLOAT_EQ(plan.update.schedule.min_lr, 1e-4f);
  EXPECT_EQ(plan.update.schedule.total_steps, 20);
  EXPECT_EQ(plan.update.is.mode, IsMode::kRejection);
  EXPECT_EQ(plan.update.is.level, RejectionLevel::kSequence);
  EXPECT_EQ(plan.update.is.upper, 3);
  EXPECT_EQ(plan.update.is.lower, 0.25);
}

TEST(JobPlanTest, PpoTrainsACriticThatLearnsFasterThanThePolicy) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.set_algorithm(trainer::v1::ALGORITHM_PPO);
  spec.mutable_algorithm_config()->set_truncated_gae(true);
  const JobPlan plan = Plan(spec);
  EXPECT_TRUE(plan.trains_critic);
  EXPECT_TRUE(plan.update.whiten_advantages);
  EXPECT_TRUE(plan.update.critic.truncated_gae);
  EXPECT_FLOAT_EQ(plan.update.critic.learning_rate, kCriticLearningRateFactor * 1e-3);
}

TEST(JobPlanTest, IcePopWidensTheUpperBound) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_is_correction()->set_mode(trainer::v1::IS_CORRECTION_MODE_ICEPOP);
  const JobPlan plan = Plan(spec);
  EXPECT_EQ(plan.update.is.mode, IsMode::kIcePop);
  EXPECT_EQ(plan.update.is.upper, kIcePopUpper);
}

TEST(JobPlanTest, GreedySamplingTrainsOnUntemperedLogProbs) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_sampling()->set_temperature(0);
  EXPECT_FLOAT_EQ(Plan(spec).update.temperature, 1.0f);
}

TEST(JobPlanTest, ARefusedSpecHasNoPlan) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.set_group_size(1);
  EXPECT_EQ(PlanJob(spec, "job-1", "/out").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(JobPlanTest, AStoredSpecPlansToTheSamePlan) {
  const JobPlan first = Plan(MinimalValidSpec());
  absl::StatusOr<JobPlan> again = PlanJob(first.spec, "job-1", "/elsewhere");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->spec.SerializeAsString(), first.spec.SerializeAsString());
  EXPECT_EQ(again->spec.output_dir(), "/out/job-1");
}

TEST(JobPlanTest, CheckpointsEveryNStepsAndAfterTheLast) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.set_checkpoint_every(4);
  const JobPlan plan = Plan(spec);
  EXPECT_FALSE(plan.CheckpointsAfter(3));
  EXPECT_TRUE(plan.CheckpointsAfter(4));
  EXPECT_TRUE(plan.CheckpointsAfter(8));
  EXPECT_FALSE(plan.CheckpointsAfter(9));
  EXPECT_TRUE(plan.CheckpointsAfter(10));
}

}  // namespace
}  // namespace tandem::trainer
