#include "services/trainer/job/job_plan.h"

#include <algorithm>

#include "services/trainer/api/job_spec.h"

namespace tandem::trainer {
namespace {

engine::LrDecay DecayOf(trainer::v1::LrDecay decay) {
  switch (decay) {
    case trainer::v1::LR_DECAY_LINEAR:
      return engine::LrDecay::kLinear;
    case trainer::v1::LR_DECAY_COSINE:
      return engine::LrDecay::kCosine;
    default:
      return engine::LrDecay::kConstant;
  }
}

engine::ScheduleConfig ScheduleOf(const trainer::v1::JobSpec& spec) {
  const trainer::v1::AlgorithmConfig& algorithm = spec.algorithm_config();
  const trainer::v1::LearningRateSchedule& schedule = algorithm.lr_schedule();
  const auto peak = static_cast<float>(algorithm.learning_rate());
  return {.peak_lr = peak,
          .min_lr = static_cast<float>(peak * schedule.min_lr_ratio()),
          .warmup_steps = schedule.warmup_updates(),
          .total_steps = std::max<int64_t>(1, spec.num_steps() * algorithm.updates_per_step()),
          .decay = DecayOf(schedule.decay())};
}

Aggregation AggregationOf(trainer::v1::LossAggregation aggregation) {
  switch (aggregation) {
    case trainer::v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_SUM:
      return Aggregation::kSeqMeanTokenSum;
    case trainer::v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_MEAN:
      return Aggregation::kSeqMeanTokenMean;
    default:
      return Aggregation::kTokenMean;
  }
}

KlEstimator KlEstimatorOf(trainer::v1::KlEstimator estimator) {
  switch (estimator) {
    case trainer::v1::KL_ESTIMATOR_K1:
      return KlEstimator::kK1;
    case trainer::v1::KL_ESTIMATOR_K2:
      return KlEstimator::kK2;
    default:
      return KlEstimator::kK3;
  }
}

IsConfig IsConfigOf(const trainer::v1::IsCorrection& correction) {
  IsConfig config{.upper = correction.upper_bound(),
                  .lower = correction.lower_bound(),
                  .level = correction.rejection_level() == trainer::v1::REJECTION_LEVEL_SEQUENCE
                               ? RejectionLevel::kSequence
                               : RejectionLevel::kToken};
  switch (correction.mode()) {
    case trainer::v1::IS_CORRECTION_MODE_TOKEN_TIS:
      config.mode = IsMode::kTokenTis;
      break;
    case trainer::v1::IS_CORRECTION_MODE_SEQUENCE_TIS:
      config.mode = IsMode::kSequenceTis;
      break;
    case trainer::v1::IS_CORRECTION_MODE_ICEPOP:
      config.mode = IsMode::kIcePop;
      break;
    case trainer::v1::IS_CORRECTION_MODE_REJECTION:
      config.mode = IsMode::kRejection;
      break;
    default:
      config.mode = IsMode::kNone;
  }
  return config;
}

RouteReplay ReplayOf(trainer::v1::RoutingReplayMode mode) {
  switch (mode) {
    case trainer::v1::ROUTING_REPLAY_MODE_OFF:
      return RouteReplay::kOff;
    case trainer::v1::ROUTING_REPLAY_MODE_R2:
      return RouteReplay::kR2;
    default:
      return RouteReplay::kR3;
  }
}

PolicyUpdateConfig UpdateConfigOf(const trainer::v1::JobSpec& spec) {
  const trainer::v1::AlgorithmConfig& algorithm = spec.algorithm_config();
  // A greedy rollout (temperature 0) reports the log-probs of softmax(logits).
  const float temperature = spec.sampling().temperature();
  return {.baseline = spec.algorithm() == trainer::v1::ALGORITHM_DR_GRPO ? GroupBaseline::kDrGrpo
                                                                         : GroupBaseline::kGrpo,
          .critic = {.learning_rate = static_cast<float>(algorithm.value_learning_rate()),
                     .gamma = algorithm.gamma(),
                     .lambda = algorithm.gae_lambda(),
                     .truncated_gae = algorithm.truncated_gae(),
                     .loss_coef = algorithm.value_loss_coef(),
                     .value_clip = algorithm.value_clip()},
          .whiten_advantages = algorithm.whiten_advantages(),
          .loss = {.clip_low = algorithm.clip_eps_low(),
                   .clip_high = algorithm.clip_eps_high(),
                   .dual_clip_c = algorithm.dual_clip_c(),
                   .aggregation = AggregationOf(algorithm.loss_aggregation()),
                   .kl_coef = algorithm.kl_coef(),
                   .kl_estimator = KlEstimatorOf(algorithm.kl_estimator())},
          .is = IsConfigOf(spec.is_correction()),
          .replay = ReplayOf(spec.routing_replay()),
          .updates_per_step = algorithm.updates_per_step(),
          .micro_batch_size = spec.micro_batch_size(),
          .schedule = ScheduleOf(spec),
          .max_grad_norm = static_cast<float>(algorithm.max_grad_norm()),
          .temperature = temperature > 0 ? temperature : 1};
}

}  // namespace

bool JobPlan::CheckpointsAfter(int64_t step) const {
  return (spec.checkpoint_every() > 0 && step % spec.checkpoint_every() == 0) ||
         step == spec.num_steps();
}

absl::StatusOr<JobPlan> PlanJob(const trainer::v1::JobSpec& spec, const std::string& job_id,
                                const std::string& default_output_dir) {
  absl::StatusOr<trainer::v1::JobSpec> resolved = ResolveJobSpec(spec, job_id, default_output_dir);
  if (!resolved.ok()) return resolved.status();
  JobPlan plan{.spec = *std::move(resolved)};
  plan.update = UpdateConfigOf(plan.spec);
  plan.adamw.weight_decay = static_cast<float>(plan.spec.algorithm_config().weight_decay());
  plan.trains_critic = plan.spec.algorithm() == trainer::v1::ALGORITHM_PPO;
  plan.data_parallel = plan.spec.parallelism().data_parallel();
  plan.expert_parallel = plan.spec.parallelism().expert_parallel();
  plan.balance_experts = plan.spec.parallelism().balance_experts();
  plan.lookahead =
      plan.spec.sync_mode() == trainer::v1::SYNC_MODE_ASYNC ? plan.spec.max_staleness() : 0;
  return plan;
}

}  // namespace tandem::trainer
