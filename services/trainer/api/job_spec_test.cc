// ResolveJobSpec: every rule of trainer.proto's JobSpec that can be checked before the job runs
// (INVALID_ARGUMENT naming the field) and every default it resolves into the stored spec.
#include "services/trainer/api/job_spec.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/trainer/api/job_spec_testing.h"
#include "tandem/trainer/v1/trainer.pb.h"
#include "tandem/type/v1/common.pb.h"

namespace tandem::trainer {
namespace {

using ::testing::HasSubstr;

constexpr char kJobId[] = "job-7f3a2c91d0e4";
constexpr char kOutputDir[] = "/var/lib/tandem/jobs/job-7f3a2c91d0e4";
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInfinity = std::numeric_limits<double>::infinity();

// jobs/demo.yaml as proto fields.
trainer::v1::JobSpec DemoSpec() {
  trainer::v1::JobSpec spec;
  spec.set_display_name("addition-grpo-r3");
  spec.mutable_task()->set_name("addition");
  (*spec.mutable_task()->mutable_params())["digits"] = "1";
  spec.set_base_model_path(".tandem/base_model_addition1.safetensors");
  spec.mutable_lora()->set_rank(8);
  spec.mutable_lora()->set_alpha(16);
  spec.set_algorithm(trainer::v1::ALGORITHM_GRPO);
  spec.mutable_algorithm_config()->set_learning_rate(0.005);
  spec.mutable_algorithm_config()->set_max_grad_norm(1.0);
  spec.set_routing_replay(trainer::v1::ROUTING_REPLAY_MODE_R3);
  spec.mutable_is_correction()->set_mode(trainer::v1::IS_CORRECTION_MODE_TOKEN_TIS);
  spec.set_prompts_per_step(64);
  spec.set_group_size(8);
  spec.set_num_steps(100);
  spec.set_micro_batch_size(64);
  spec.mutable_sampling()->set_temperature(0.6f);
  spec.mutable_sampling()->set_max_new_tokens(4);
  spec.set_checkpoint_every(25);
  spec.set_seed(7);
  return spec;
}

absl::StatusOr<trainer::v1::JobSpec> Resolve(const trainer::v1::JobSpec& spec) {
  return ResolveJobSpec(spec, kJobId, kOutputDir);
}

absl::Status ResolveStatus(const trainer::v1::JobSpec& spec) { return Resolve(spec).status(); }

// The resolved spec; an empty one (and a failure) when the spec is rejected.
trainer::v1::JobSpec ResolveOk(const trainer::v1::JobSpec& spec) {
  absl::StatusOr<trainer::v1::JobSpec> resolved = Resolve(spec);
  EXPECT_TRUE(resolved.ok()) << resolved.status();
  return resolved.ok() ? *std::move(resolved) : trainer::v1::JobSpec();
}

MATCHER_P(IsInvalidArgumentWith, message, "") {
  return absl::IsInvalidArgument(arg) &&
         ::testing::ExplainMatchResult(HasSubstr(message), std::string(arg.message()),
                                       result_listener);
}

// ---------------------------------------------------------------------------------------------
// Good specs.

TEST(ResolveJobSpecTest, TheMinimalSpecIsAccepted) {
  EXPECT_TRUE(ResolveStatus(MinimalValidSpec()).ok()) << ResolveStatus(MinimalValidSpec());
}

TEST(ResolveJobSpecTest, TheDemoJobIsAcceptedWithItsValuesKept) {
  const trainer::v1::JobSpec resolved = ResolveOk(DemoSpec());
  EXPECT_EQ(resolved.display_name(), "addition-grpo-r3");
  EXPECT_EQ(resolved.task().name(), "addition");
  EXPECT_EQ(resolved.task().params().at("digits"), "1");
  EXPECT_EQ(resolved.base_model_path(), ".tandem/base_model_addition1.safetensors");
  EXPECT_EQ(resolved.lora().rank(), 8);
  EXPECT_FLOAT_EQ(resolved.lora().alpha(), 16);
  EXPECT_EQ(resolved.algorithm(), trainer::v1::ALGORITHM_GRPO);
  EXPECT_DOUBLE_EQ(resolved.algorithm_config().learning_rate(), 0.005);
  EXPECT_DOUBLE_EQ(resolved.algorithm_config().max_grad_norm(), 1.0);
  EXPECT_EQ(resolved.routing_replay(), trainer::v1::ROUTING_REPLAY_MODE_R3);
  EXPECT_EQ(resolved.is_correction().mode(), trainer::v1::IS_CORRECTION_MODE_TOKEN_TIS);
  EXPECT_EQ(resolved.prompts_per_step(), 64);
  EXPECT_EQ(resolved.group_size(), 8);
  EXPECT_EQ(resolved.num_steps(), 100);
  EXPECT_EQ(resolved.micro_batch_size(), 64);
  EXPECT_FLOAT_EQ(resolved.sampling().temperature(), 0.6f);
  EXPECT_EQ(resolved.sampling().max_new_tokens(), 4);
  EXPECT_EQ(resolved.checkpoint_every(), 25);
  EXPECT_EQ(resolved.seed(), 7u);
  EXPECT_EQ(resolved.adapter_name(), kJobId);
  EXPECT_EQ(resolved.output_dir(), kOutputDir);
}

TEST(ResolveJobSpecTest, EveryBuiltInTaskIsAccepted) {
  for (const char* name : {"addition", "reverse", "sort"}) {
    trainer::v1::JobSpec spec = MinimalValidSpec();
    spec.mutable_task()->set_name(name);
    EXPECT_TRUE(ResolveStatus(spec).ok()) << name << ": " << ResolveStatus(spec);
  }
}

TEST(ResolveJobSpecTest, ADatasetWithExactMatchIsAccepted) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_dataset()->set_path("/data/prompts.jsonl");
  spec.mutable_dataset()->set_verifier("exact_match");
  EXPECT_TRUE(ResolveStatus(spec).ok()) << ResolveStatus(spec);
}

TEST(ResolveJobSpecTest, DrGrpoIsAccepted) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.set_algorithm(trainer::v1::ALGORITHM_DR_GRPO);
  EXPECT_TRUE(ResolveStatus(spec).ok()) << ResolveStatus(spec);
}

TEST(ResolveJobSpecTest, RangeLimitsAreInclusive) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.set_display_name(std::string(256, 'x'));
  EXPECT_TRUE(ResolveStatus(spec).ok()) << ResolveStatus(spec);
  spec = MinimalValidSpec();
  spec.set_prompts_per_step(65536);
  EXPECT_TRUE(ResolveStatus(spec).ok()) << ResolveStatus(spec);
  spec = MinimalValidSpec();
  spec.set_group_size(256);
  EXPECT_TRUE(ResolveStatus(spec).ok()) << ResolveStatus(spec);
  spec = MinimalValidSpec();
  spec.set_num_steps(10'000'000);
  EXPECT_TRUE(ResolveStatus(spec).ok()) << ResolveStatus(spec);
}

TEST(ResolveJobSpecTest, ResolvingAResolvedSpecChangesNothing) {
  const trainer::v1::JobSpec resolved = ResolveOk(DemoSpec());
  EXPECT_EQ(ResolveOk(resolved).DebugString(), resolved.DebugString());
}

// ---------------------------------------------------------------------------------------------
// data: task or dataset.

TEST(ResolveJobSpecTest, TaskOrDatasetIsRequired) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.clear_task();
  EXPECT_THAT(ResolveStatus(spec), IsInvalidArgumentWith("spec.task or dataset is required"));
}

TEST(ResolveJobSpecTest, UnknownTaskIsRejected) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_task()->set_name("chess");
  EXPECT_THAT(ResolveStatus(spec), IsInvalidArgumentWith("spec.task: unknown task \"chess\""));
}

TEST(ResolveJobSpecTest, UnknownTaskParamIsRejected) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  (*spec.mutable_task()->mutable_params())["width"] = "3";
  EXPECT_THAT(ResolveStatus(spec), IsInvalidArgumentWith("spec.task.params: unknown key 'width'"));
}

TEST(ResolveJobSpecTest, NonNumericTaskDigitsAreRejected) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  (*spec.mutable_task()->mutable_params())["digits"] = "many";
  EXPECT_THAT(ResolveStatus(spec),
              IsInvalidArgumentWith("spec.task.params.digits: 'many' is not a number"));
}

TEST(ResolveJobSpecTest, TaskDigitsOutsideOneToNineAreRejected) {
  for (const char* digits : {"0", "10"}) {
    trainer::v1::JobSpec spec = MinimalValidSpec();
    (*spec.mutable_task()->mutable_params())["digits"] = digits;
    EXPECT_THAT(ResolveStatus(spec),
                IsInvalidArgumentWith(std::string("spec.task: task digits = ") + digits +
                                      " is outside [1, 9]"));
  }
}

TEST(ResolveJobSpecTest, DatasetPathIsRequired) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_dataset()->set_verifier("exact_match");
  EXPECT_THAT(ResolveStatus(spec), IsInvalidArgumentWith("spec.dataset.path is required"));
}

TEST(ResolveJobSpecTest, UnknownDatasetVerifierIsRejected) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_dataset()->set_path("/data/prompts.jsonl");
  spec.mutable_dataset()->set_verifier("fuzzy");
  EXPECT_THAT(
      ResolveStatus(spec),
      IsInvalidArgumentWith("spec.dataset.verifier: 'fuzzy' is unknown; known: exact_match, math"));
}

TEST(ResolveJobSpecTest, DatasetVerifierIsRequired) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_dataset()->set_path("/data/prompts.jsonl");
  EXPECT_THAT(
      ResolveStatus(spec),
      IsInvalidArgumentWith("spec.dataset.verifier: '' is unknown; known: exact_match, math"));
}

// ---------------------------------------------------------------------------------------------
// Sizes and required scalars.

TEST(ResolveJobSpecTest, DisplayNameOver256BytesIsRejected) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.set_display_name(std::string(257, 'x'));
  EXPECT_THAT(ResolveStatus(spec),
              IsInvalidArgumentWith("spec.display_name has 257 bytes; at most 256"));
}

TEST(ResolveJobSpecTest, BaseModelPathIsRequired) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.clear_base_model_path();
  EXPECT_THAT(ResolveStatus(spec), IsInvalidArgumentWith("spec.base_model_path is required"));
}

TEST(ResolveJobSpecTest, PromptsPerStepMustBeInOneTo65536) {
  for (int prompts : {0, -1, 65537}) {
    trainer::v1::JobSpec spec = MinimalValidSpec();
    spec.set_prompts_per_step(prompts);
    EXPECT_THAT(ResolveStatus(spec),
                IsInvalidArgumentWith("spec.prompts_per_step must be in 1..65536"))
        << prompts;
  }
}

TEST(ResolveJobSpecTest, ParallelismIsWrittenOutAndItsRanksMustSplitTheGroups) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.set_prompts_per_step(8);
  const trainer::v1::JobSpec resolved = ResolveOk(spec);
  EXPECT_EQ(resolved.parallelism().data_parallel(), 1);
  EXPECT_EQ(resolved.parallelism().expert_parallel(), 1);
  spec.mutable_parallelism()->set_data_parallel(2);
  spec.mutable_parallelism()->set_expert_parallel(4);
  EXPECT_TRUE(ResolveStatus(spec).ok()) << ResolveStatus(spec);
  spec.mutable_parallelism()->set_expert_parallel(3);
  EXPECT_THAT(ResolveStatus(spec),
              IsInvalidArgumentWith("spec.parallelism.data_parallel x expert_parallel (6 ranks)"));
  for (int experts : {-1, 1025}) {
    spec.mutable_parallelism()->set_expert_parallel(experts);
    EXPECT_THAT(ResolveStatus(spec), IsInvalidArgumentWith("spec.parallelism.expert_parallel is"))
        << experts;
  }
  spec.mutable_parallelism()->set_expert_parallel(2);
  spec.mutable_parallelism()->set_balance_experts(true);
  EXPECT_TRUE(ResolveStatus(spec).ok()) << ResolveStatus(spec);
  spec.set_routing_replay(trainer::v1::ROUTING_REPLAY_MODE_R2);
  EXPECT_THAT(ResolveStatus(spec), IsInvalidArgumentWith("it needs routing_replay R3"));
  spec.set_routing_replay(trainer::v1::ROUTING_REPLAY_MODE_R3);
  spec.mutable_parallelism()->set_expert_parallel(1);
  EXPECT_THAT(ResolveStatus(spec), IsInvalidArgumentWith("spec.parallelism.balance_experts needs"));
  spec.mutable_parallelism()->set_balance_experts(false);
  spec.mutable_parallelism()->set_expert_parallel(2);
  spec.set_algorithm(trainer::v1::ALGORITHM_PPO);
  spec.set_group_size(1);
  EXPECT_THAT(ResolveStatus(spec), IsInvalidArgumentWith("does not train expert-parallel yet"));
}

TEST(ResolveJobSpecTest, GroupSizeMustBeInOneTo256) {
  for (int group : {0, -1, 257}) {
    trainer::v1::JobSpec spec = MinimalValidSpec();
    spec.set_group_size(group);
    EXPECT_THAT(ResolveStatus(spec), IsInvalidArgumentWith("spec.group_size must be in 1..256"))
        << group;
  }
}

TEST(ResolveJobSpecTest, NumStepsMustBeInOneToTenMillion) {
  for (int64_t steps : {int64_t{0}, int64_t{-1}, int64_t{10'000'001}}) {
    trainer::v1::JobSpec spec = MinimalValidSpec();
    spec.set_num_steps(steps);
    EXPECT_THAT(ResolveStatus(spec), IsInvalidArgumentWith("spec.num_steps must be in 1..10^7"))
        << steps;
  }
}

TEST(ResolveJobSpecTest, MicroBatchSizeOutOfRangeIsRejected) {
  for (int size : {-1, 65537, std::numeric_limits<int32_t>::max()}) {
    trainer::v1::JobSpec spec = MinimalValidSpec();
    spec.set_micro_batch_size(size);
    EXPECT_THAT(ResolveStatus(spec),
                IsInvalidArgumentWith(
                    absl::StrCat("spec.micro_batch_size is ", size, "; must be in 1..65536")));
  }
}

TEST(ResolveJobSpecTest, SamplingMaxNewTokensIsRequired) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.clear_sampling();
  EXPECT_THAT(ResolveStatus(spec),
              IsInvalidArgumentWith("spec.sampling.max_new_tokens is 0; must be >= 1"));
  spec = MinimalValidSpec();
  spec.mutable_sampling()->set_max_new_tokens(0);
  EXPECT_THAT(ResolveStatus(spec),
              IsInvalidArgumentWith("spec.sampling.max_new_tokens is 0; must be >= 1"));
}

TEST(ResolveJobSpecTest, NegativeCheckpointEveryIsRejected) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.set_checkpoint_every(-1);
  EXPECT_THAT(ResolveStatus(spec), IsInvalidArgumentWith("spec.checkpoint_every must be >= 0"));
}

// ---------------------------------------------------------------------------------------------
// algorithm and algorithm_config.

TEST(ResolveJobSpecTest, AlgorithmIsRequired) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.clear_algorithm();
  EXPECT_THAT(ResolveStatus(spec),
              IsInvalidArgumentWith("spec.algorithm is required (GRPO, DR_GRPO or PPO)"));
}

TEST(ResolveJobSpecTest, PpoTakesGroupsOfOneWhitensByDefaultAndDefaultsItsValueLoss) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.set_algorithm(trainer::v1::ALGORITHM_PPO);
  spec.set_group_size(1);
  absl::StatusOr<trainer::v1::JobSpec> resolved = Resolve(spec);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_TRUE(resolved->algorithm_config().whiten_advantages());
  EXPECT_EQ(resolved->algorithm_config().value_loss_coef(), 0.1);
  EXPECT_EQ(resolved->algorithm_config().value_clip(), 0.2);
  EXPECT_DOUBLE_EQ(resolved->algorithm_config().value_learning_rate(),
                   10 * resolved->algorithm_config().learning_rate());
  spec.mutable_algorithm_config()->set_whiten_advantages(false);
  spec.mutable_algorithm_config()->set_value_clip(0);
  resolved = Resolve(spec);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_FALSE(resolved->algorithm_config().whiten_advantages());
  EXPECT_EQ(resolved->algorithm_config().value_clip(), 0);
}

TEST(ResolveJobSpecTest, ValueLossSettingsMustBeNonNegativeAndFinite) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.set_algorithm(trainer::v1::ALGORITHM_PPO);
  spec.mutable_algorithm_config()->set_value_loss_coef(-0.5);
  EXPECT_THAT(ResolveStatus(spec),
              IsInvalidArgumentWith(
                  "spec.algorithm_config.value_loss_coef is -0.5; must be >= 0 and finite"));
  spec.mutable_algorithm_config()->set_value_loss_coef(0.5);
  spec.mutable_algorithm_config()->set_value_clip(std::numeric_limits<double>::infinity());
  EXPECT_THAT(
      ResolveStatus(spec),
      IsInvalidArgumentWith("spec.algorithm_config.value_clip is inf; must be >= 0 and finite"));
  spec.mutable_algorithm_config()->set_value_clip(0.2);
  spec.mutable_algorithm_config()->set_value_learning_rate(0);
  EXPECT_THAT(ResolveStatus(spec),
              IsInvalidArgumentWith(
                  "spec.algorithm_config.value_learning_rate is 0; must be > 0 and finite"));
}

TEST(ResolveJobSpecTest, GroupSizeBelowTwoIsRejectedForGrpo) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.set_group_size(1);
  EXPECT_THAT(ResolveStatus(spec),
              IsInvalidArgumentWith("spec.group_size: ALGORITHM_GRPO needs >= 2"));
}

TEST(ResolveJobSpecTest, GroupSizeBelowTwoIsRejectedForDrGrpo) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.set_algorithm(trainer::v1::ALGORITHM_DR_GRPO);
  spec.set_group_size(1);
  EXPECT_THAT(ResolveStatus(spec),
              IsInvalidArgumentWith("spec.group_size: ALGORITHM_DR_GRPO needs >= 2"));
}

TEST(ResolveJobSpecTest, LearningRateMustBePositiveAndFinite) {
  for (double rate : {0.0, -1e-3, kNan, kInfinity}) {
    trainer::v1::JobSpec spec = MinimalValidSpec();
    spec.mutable_algorithm_config()->set_learning_rate(rate);
    EXPECT_THAT(ResolveStatus(spec),
                IsInvalidArgumentWith("spec.algorithm_config.learning_rate is "))
        << rate;
  }
}

TEST(ResolveJobSpecTest, TheLearningRateScheduleDefaultsToConstantAndIsChecked) {
  EXPECT_EQ(ResolveOk(MinimalValidSpec()).algorithm_config().lr_schedule().decay(),
            trainer::v1::LR_DECAY_CONSTANT);
  trainer::v1::JobSpec spec = MinimalValidSpec();
  trainer::v1::LearningRateSchedule& schedule =
      *spec.mutable_algorithm_config()->mutable_lr_schedule();
  schedule.set_decay(trainer::v1::LR_DECAY_COSINE);
  schedule.set_warmup_updates(spec.num_steps());
  schedule.set_min_lr_ratio(0.1);
  EXPECT_TRUE(ResolveStatus(spec).ok()) << ResolveStatus(spec);
  schedule.set_warmup_updates(spec.num_steps() + 1);
  EXPECT_THAT(ResolveStatus(spec),
              IsInvalidArgumentWith("spec.algorithm_config.lr_schedule.warmup_updates is "));
  schedule.set_warmup_updates(0);
  schedule.set_min_lr_ratio(1.5);
  EXPECT_THAT(ResolveStatus(spec),
              IsInvalidArgumentWith("spec.algorithm_config.lr_schedule.min_lr_ratio is 1.5"));
  schedule.set_min_lr_ratio(0);
  schedule.set_decay(static_cast<trainer::v1::LrDecay>(9));
  EXPECT_THAT(ResolveStatus(spec),
              IsInvalidArgumentWith("spec.algorithm_config.lr_schedule.decay"));
}

TEST(ResolveJobSpecTest, AlgorithmConfigIsRequired) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.clear_algorithm_config();
  EXPECT_THAT(ResolveStatus(spec),
              IsInvalidArgumentWith("spec.algorithm_config.learning_rate is "));
}

TEST(ResolveJobSpecTest, NegativeWeightDecayIsRejected) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_algorithm_config()->set_weight_decay(-0.1);
  EXPECT_THAT(ResolveStatus(spec), IsInvalidArgumentWith("spec.algorithm_config.weight_decay is "));
}

TEST(ResolveJobSpecTest, NegativeMaxGradNormIsRejected) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_algorithm_config()->set_max_grad_norm(-1);
  EXPECT_THAT(ResolveStatus(spec),
              IsInvalidArgumentWith("spec.algorithm_config.max_grad_norm is "));
}

TEST(ResolveJobSpecTest, ClipEpsLowMustBeInZeroToOne) {
  for (double eps : {-0.1, 1.0, 1.5}) {
    trainer::v1::JobSpec spec = MinimalValidSpec();
    spec.mutable_algorithm_config()->set_clip_eps_low(eps);
    EXPECT_THAT(ResolveStatus(spec), IsInvalidArgumentWith("; must be in [0, 1)")) << eps;
  }
}

TEST(ResolveJobSpecTest, NegativeClipEpsHighIsRejected) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_algorithm_config()->set_clip_eps_high(-0.1);
  EXPECT_THAT(ResolveStatus(spec),
              IsInvalidArgumentWith("spec.algorithm_config.clip_eps_high is "));
}

TEST(ResolveJobSpecTest, DualClipCMustExceedOneUnlessZero) {
  for (double c : {1.0, 0.5, -2.0}) {
    trainer::v1::JobSpec spec = MinimalValidSpec();
    spec.mutable_algorithm_config()->set_dual_clip_c(c);
    EXPECT_THAT(ResolveStatus(spec),
                IsInvalidArgumentWith("must be > 1 and finite (or 0 to disable)"))
        << c;
  }
}

TEST(ResolveJobSpecTest, NegativeKlCoefIsRejected) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_algorithm_config()->set_kl_coef(-0.01);
  EXPECT_THAT(ResolveStatus(spec), IsInvalidArgumentWith("spec.algorithm_config.kl_coef is "));
}

TEST(ResolveJobSpecTest, GammaMustBeInZeroToOne) {
  for (double gamma : {-0.1, 1.5}) {
    trainer::v1::JobSpec spec = MinimalValidSpec();
    spec.mutable_algorithm_config()->set_gamma(gamma);
    EXPECT_THAT(
        ResolveStatus(spec),
        IsInvalidArgumentWith("spec.algorithm_config.gamma and gae_lambda must be in [0, 1]"))
        << gamma;
  }
}

TEST(ResolveJobSpecTest, GaeLambdaMustBeInZeroToOne) {
  for (double lambda : {-0.1, 1.5}) {
    trainer::v1::JobSpec spec = MinimalValidSpec();
    spec.mutable_algorithm_config()->set_gae_lambda(lambda);
    EXPECT_THAT(
        ResolveStatus(spec),
        IsInvalidArgumentWith("spec.algorithm_config.gamma and gae_lambda must be in [0, 1]"))
        << lambda;
  }
}

TEST(ResolveJobSpecTest, NegativeUpdatesPerStepIsRejected) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_algorithm_config()->set_updates_per_step(-1);
  EXPECT_THAT(ResolveStatus(spec),
              IsInvalidArgumentWith("spec.algorithm_config.updates_per_step must be >= 1 and "
                                    "divide prompts_per_step"));
}

TEST(ResolveJobSpecTest, UpdatesPerStepMustDividePromptsPerStep) {
  trainer::v1::JobSpec spec = MinimalValidSpec();  // prompts_per_step 4
  spec.mutable_algorithm_config()->set_updates_per_step(3);
  EXPECT_THAT(ResolveStatus(spec),
              IsInvalidArgumentWith("spec.algorithm_config.updates_per_step must be >= 1 and "
                                    "divide prompts_per_step"));
  spec.mutable_algorithm_config()->set_updates_per_step(2);
  EXPECT_TRUE(ResolveStatus(spec).ok()) << ResolveStatus(spec);
}

// ---------------------------------------------------------------------------------------------
// is_correction.

TEST(ResolveJobSpecTest, IsCorrectionUpperBoundMustBePositive) {
  for (trainer::v1::IsCorrectionMode mode :
       {trainer::v1::IS_CORRECTION_MODE_UNSPECIFIED, trainer::v1::IS_CORRECTION_MODE_TOKEN_TIS,
        trainer::v1::IS_CORRECTION_MODE_ICEPOP}) {
    for (double upper : {-1.0, 0.0}) {
      trainer::v1::JobSpec spec = MinimalValidSpec();
      spec.mutable_is_correction()->set_mode(mode);
      spec.mutable_is_correction()->set_upper_bound(upper);
      EXPECT_THAT(ResolveStatus(spec),
                  IsInvalidArgumentWith("spec.is_correction: need upper_bound > 0, "
                                        "lower_bound >= 0, upper >= lower"))
          << trainer::v1::IsCorrectionMode_Name(mode) << " " << upper;
    }
  }
}

TEST(ResolveJobSpecTest, IsCorrectionNegativeLowerBoundIsRejected) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_is_correction()->set_lower_bound(-0.1);
  EXPECT_THAT(ResolveStatus(spec),
              IsInvalidArgumentWith("spec.is_correction: need upper_bound > 0, lower_bound >= 0, "
                                    "upper >= lower"));
}

TEST(ResolveJobSpecTest, IsCorrectionUpperBelowLowerIsRejected) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_is_correction()->set_mode(trainer::v1::IS_CORRECTION_MODE_REJECTION);
  spec.mutable_is_correction()->set_upper_bound(1.0);
  spec.mutable_is_correction()->set_lower_bound(1.5);
  EXPECT_THAT(ResolveStatus(spec),
              IsInvalidArgumentWith("spec.is_correction: need upper_bound > 0, lower_bound >= 0, "
                                    "upper >= lower"));
  spec.mutable_is_correction()->set_lower_bound(1.0);
  EXPECT_TRUE(ResolveStatus(spec).ok()) << ResolveStatus(spec);
}

// ---------------------------------------------------------------------------------------------
// sync_mode and max_staleness.

TEST(ResolveJobSpecTest, MaxStalenessMustBeZeroInSync) {
  for (trainer::v1::SyncMode mode :
       {trainer::v1::SYNC_MODE_UNSPECIFIED, trainer::v1::SYNC_MODE_SYNC}) {
    for (int staleness : {2, -1}) {
      trainer::v1::JobSpec spec = MinimalValidSpec();
      spec.set_sync_mode(mode);
      spec.set_max_staleness(staleness);
      EXPECT_THAT(ResolveStatus(spec),
                  IsInvalidArgumentWith("spec.max_staleness must be 0 in SYNC"))
          << trainer::v1::SyncMode_Name(mode) << " " << staleness;
    }
  }
}

TEST(ResolveJobSpecTest, MaxStalenessMustBeInOneToSixteenInAsync) {
  for (int staleness : {17, -1}) {
    trainer::v1::JobSpec spec = MinimalValidSpec();
    spec.set_sync_mode(trainer::v1::SYNC_MODE_ASYNC);
    spec.set_max_staleness(staleness);
    EXPECT_THAT(ResolveStatus(spec), IsInvalidArgumentWith("spec.max_staleness must be in 1..16"))
        << staleness;
  }
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.set_sync_mode(trainer::v1::SYNC_MODE_ASYNC);
  spec.set_max_staleness(16);
  EXPECT_TRUE(ResolveStatus(spec).ok()) << ResolveStatus(spec);
}

TEST(ResolveJobSpecTest, PartialRolloutsNeedAsync) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.set_partial_rollouts(true);
  EXPECT_THAT(ResolveStatus(spec),
              IsInvalidArgumentWith("spec.partial_rollouts needs sync_mode ASYNC (in SYNC no "
                                    "version is published while samples generate)"));
  spec.set_sync_mode(trainer::v1::SYNC_MODE_ASYNC);
  EXPECT_TRUE(ResolveStatus(spec).ok()) << ResolveStatus(spec);
}

// ---------------------------------------------------------------------------------------------
// lora.

TEST(ResolveJobSpecTest, LoraRankIsRequired) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.clear_lora();
  EXPECT_THAT(ResolveStatus(spec), IsInvalidArgumentWith("spec.lora.rank is required"));
  for (int rank : {0, -1}) {
    spec = MinimalValidSpec();
    spec.mutable_lora()->set_rank(rank);
    EXPECT_THAT(ResolveStatus(spec), IsInvalidArgumentWith("spec.lora.rank is required")) << rank;
  }
}

TEST(ResolveJobSpecTest, LoraRankAbove1024IsRejected) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_lora()->set_rank(1025);
  EXPECT_THAT(ResolveStatus(spec),
              IsInvalidArgumentWith("spec.lora: lora.rank: 1025 not in 1..1024"));
}

TEST(ResolveJobSpecTest, NegativeOrNonFiniteLoraAlphaIsRejected) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_lora()->set_alpha(-1);
  EXPECT_THAT(ResolveStatus(spec),
              IsInvalidArgumentWith("spec.lora: lora.alpha: -1 < 0 or not finite"));
  spec.mutable_lora()->set_alpha(std::numeric_limits<float>::quiet_NaN());
  EXPECT_THAT(ResolveStatus(spec), IsInvalidArgumentWith("spec.lora: lora.alpha: "));
}

TEST(ResolveJobSpecTest, LoraDropoutMustBeInZeroToOne) {
  for (float dropout : {1.0f, -0.5f}) {
    trainer::v1::JobSpec spec = MinimalValidSpec();
    spec.mutable_lora()->set_dropout(dropout);
    EXPECT_THAT(ResolveStatus(spec), IsInvalidArgumentWith("spec.lora: lora.dropout: ")) << dropout;
  }
}

TEST(ResolveJobSpecTest, ExpertLayoutOutsideTheEnumIsRejected) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_lora()->set_expert_layout(static_cast<type::v1::ExpertLayout>(99));
  EXPECT_THAT(ResolveStatus(spec),
              IsInvalidArgumentWith("spec.lora: lora.expert_layout: 99 is not a layout"));
}

TEST(ResolveJobSpecTest, UnknownLoraTargetModuleIsRejected) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_lora()->add_target_modules("router");
  EXPECT_THAT(
      ResolveStatus(spec),
      IsInvalidArgumentWith("spec.lora: lora.target_modules: 'router' is not a LoRA target"));
}

TEST(ResolveJobSpecTest, DuplicateLoraTargetModuleIsRejected) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_lora()->add_target_modules("q_proj");
  spec.mutable_lora()->add_target_modules("q_proj");
  EXPECT_THAT(ResolveStatus(spec),
              IsInvalidArgumentWith("spec.lora: lora.target_modules: duplicate 'q_proj'"));
}

// ---------------------------------------------------------------------------------------------
// Defaults: each resolved into the returned spec; an explicit value is kept.

TEST(ResolveJobSpecTest, AdapterNameDefaultsToTheJobId) {
  EXPECT_EQ(ResolveOk(MinimalValidSpec()).adapter_name(), kJobId);
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.set_adapter_name("my-adapter");
  EXPECT_EQ(ResolveOk(spec).adapter_name(), "my-adapter");
}

TEST(ResolveJobSpecTest, OutputDirDefaultsToTheDefaultOutputDir) {
  EXPECT_EQ(ResolveOk(MinimalValidSpec()).output_dir(), kOutputDir);
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.set_output_dir("/scratch/run1");
  EXPECT_EQ(ResolveOk(spec).output_dir(), "/scratch/run1");
}

TEST(ResolveJobSpecTest, MicroBatchSizeDefaultsToEight) {
  EXPECT_EQ(ResolveOk(MinimalValidSpec()).micro_batch_size(), 8);
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.set_micro_batch_size(3);
  EXPECT_EQ(ResolveOk(spec).micro_batch_size(), 3);
}

TEST(ResolveJobSpecTest, MaxGradNormDefaultsToOneAndZeroIsKept) {
  const trainer::v1::JobSpec resolved = ResolveOk(MinimalValidSpec());
  ASSERT_TRUE(resolved.algorithm_config().has_max_grad_norm());
  EXPECT_DOUBLE_EQ(resolved.algorithm_config().max_grad_norm(), 1.0);
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_algorithm_config()->set_max_grad_norm(0);
  EXPECT_DOUBLE_EQ(ResolveOk(spec).algorithm_config().max_grad_norm(), 0.0);
}

TEST(ResolveJobSpecTest, ClipEpsLowDefaultsToPointTwo) {
  const trainer::v1::JobSpec resolved = ResolveOk(MinimalValidSpec());
  ASSERT_TRUE(resolved.algorithm_config().has_clip_eps_low());
  EXPECT_DOUBLE_EQ(resolved.algorithm_config().clip_eps_low(), 0.2);
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_algorithm_config()->set_clip_eps_low(0);
  EXPECT_DOUBLE_EQ(ResolveOk(spec).algorithm_config().clip_eps_low(), 0.0);
}

TEST(ResolveJobSpecTest, ClipEpsHighDefaultsToClipEpsLow) {
  const trainer::v1::JobSpec resolved = ResolveOk(MinimalValidSpec());
  ASSERT_TRUE(resolved.algorithm_config().has_clip_eps_high());
  EXPECT_DOUBLE_EQ(resolved.algorithm_config().clip_eps_high(), 0.2);
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_algorithm_config()->set_clip_eps_low(0.1);
  EXPECT_DOUBLE_EQ(ResolveOk(spec).algorithm_config().clip_eps_high(), 0.1);
  spec = MinimalValidSpec();
  spec.mutable_algorithm_config()->set_clip_eps_high(0.28);
  EXPECT_DOUBLE_EQ(ResolveOk(spec).algorithm_config().clip_eps_high(), 0.28);
}

TEST(ResolveJobSpecTest, DualClipCDefaultsToThreeAndZeroDisables) {
  const trainer::v1::JobSpec resolved = ResolveOk(MinimalValidSpec());
  ASSERT_TRUE(resolved.algorithm_config().has_dual_clip_c());
  EXPECT_DOUBLE_EQ(resolved.algorithm_config().dual_clip_c(), 3.0);
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_algorithm_config()->set_dual_clip_c(0);
  EXPECT_DOUBLE_EQ(ResolveOk(spec).algorithm_config().dual_clip_c(), 0.0);
}

TEST(ResolveJobSpecTest, KlEstimatorDefaultsToK3) {
  EXPECT_EQ(ResolveOk(MinimalValidSpec()).algorithm_config().kl_estimator(),
            trainer::v1::KL_ESTIMATOR_K3);
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_algorithm_config()->set_kl_estimator(trainer::v1::KL_ESTIMATOR_K1);
  EXPECT_EQ(ResolveOk(spec).algorithm_config().kl_estimator(), trainer::v1::KL_ESTIMATOR_K1);
}

TEST(ResolveJobSpecTest, GammaAndGaeLambdaDefaultToOne) {
  const trainer::v1::JobSpec resolved = ResolveOk(MinimalValidSpec());
  ASSERT_TRUE(resolved.algorithm_config().has_gamma());
  ASSERT_TRUE(resolved.algorithm_config().has_gae_lambda());
  EXPECT_DOUBLE_EQ(resolved.algorithm_config().gamma(), 1.0);
  EXPECT_DOUBLE_EQ(resolved.algorithm_config().gae_lambda(), 1.0);
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_algorithm_config()->set_gamma(0);
  EXPECT_DOUBLE_EQ(ResolveOk(spec).algorithm_config().gamma(), 0.0);
}

TEST(ResolveJobSpecTest, WhitenAdvantagesDefaultsToFalse) {
  const trainer::v1::JobSpec resolved = ResolveOk(MinimalValidSpec());
  ASSERT_TRUE(resolved.algorithm_config().has_whiten_advantages());
  EXPECT_FALSE(resolved.algorithm_config().whiten_advantages());
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_algorithm_config()->set_whiten_advantages(true);
  EXPECT_TRUE(ResolveOk(spec).algorithm_config().whiten_advantages());
}

TEST(ResolveJobSpecTest, LossAggregationDefaultsToTokenMean) {
  EXPECT_EQ(ResolveOk(MinimalValidSpec()).algorithm_config().loss_aggregation(),
            trainer::v1::LOSS_AGGREGATION_TOKEN_MEAN);
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_algorithm_config()->set_loss_aggregation(
      trainer::v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_SUM);
  EXPECT_EQ(ResolveOk(spec).algorithm_config().loss_aggregation(),
            trainer::v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_SUM);
}

TEST(ResolveJobSpecTest, UpdatesPerStepDefaultsToOne) {
  EXPECT_EQ(ResolveOk(MinimalValidSpec()).algorithm_config().updates_per_step(), 1);
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_algorithm_config()->set_updates_per_step(4);
  EXPECT_EQ(ResolveOk(spec).algorithm_config().updates_per_step(), 4);
}

TEST(ResolveJobSpecTest, IsCorrectionDefaultsToNoneWithBoundsTwoAndOneHalf) {
  const trainer::v1::IsCorrection resolved = ResolveOk(MinimalValidSpec()).is_correction();
  EXPECT_EQ(resolved.mode(), trainer::v1::IS_CORRECTION_MODE_NONE);
  ASSERT_TRUE(resolved.has_upper_bound());
  ASSERT_TRUE(resolved.has_lower_bound());
  EXPECT_DOUBLE_EQ(resolved.upper_bound(), 2.0);
  EXPECT_DOUBLE_EQ(resolved.lower_bound(), 0.5);
  EXPECT_EQ(resolved.rejection_level(), trainer::v1::REJECTION_LEVEL_TOKEN);
}

TEST(ResolveJobSpecTest, UpperBoundDefaultsToTwoForTisAndRejection) {
  for (trainer::v1::IsCorrectionMode mode :
       {trainer::v1::IS_CORRECTION_MODE_TOKEN_TIS, trainer::v1::IS_CORRECTION_MODE_SEQUENCE_TIS,
        trainer::v1::IS_CORRECTION_MODE_REJECTION}) {
    trainer::v1::JobSpec spec = MinimalValidSpec();
    spec.mutable_is_correction()->set_mode(mode);
    const trainer::v1::IsCorrection resolved = ResolveOk(spec).is_correction();
    EXPECT_EQ(resolved.mode(), mode);
    EXPECT_DOUBLE_EQ(resolved.upper_bound(), 2.0) << trainer::v1::IsCorrectionMode_Name(mode);
    EXPECT_DOUBLE_EQ(resolved.lower_bound(), 0.5) << trainer::v1::IsCorrectionMode_Name(mode);
  }
}

TEST(ResolveJobSpecTest, IcepopUpperBoundDefaultsToFive) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_is_correction()->set_mode(trainer::v1::IS_CORRECTION_MODE_ICEPOP);
  const trainer::v1::IsCorrection resolved = ResolveOk(spec).is_correction();
  EXPECT_DOUBLE_EQ(resolved.upper_bound(), 5.0);
  EXPECT_DOUBLE_EQ(resolved.lower_bound(), 0.5);
}

TEST(ResolveJobSpecTest, ExplicitIsCorrectionValuesAreKept) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_is_correction()->set_mode(trainer::v1::IS_CORRECTION_MODE_REJECTION);
  spec.mutable_is_correction()->set_upper_bound(3.0);
  spec.mutable_is_correction()->set_lower_bound(0.25);
  spec.mutable_is_correction()->set_rejection_level(trainer::v1::REJECTION_LEVEL_SEQUENCE);
  const trainer::v1::IsCorrection resolved = ResolveOk(spec).is_correction();
  EXPECT_DOUBLE_EQ(resolved.upper_bound(), 3.0);
  EXPECT_DOUBLE_EQ(resolved.lower_bound(), 0.25);
  EXPECT_EQ(resolved.rejection_level(), trainer::v1::REJECTION_LEVEL_SEQUENCE);
}

TEST(ResolveJobSpecTest, RoutingReplayDefaultsToR3) {
  EXPECT_EQ(ResolveOk(MinimalValidSpec()).routing_replay(), trainer::v1::ROUTING_REPLAY_MODE_R3);
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.set_routing_replay(trainer::v1::ROUTING_REPLAY_MODE_R2);
  EXPECT_EQ(ResolveOk(spec).routing_replay(), trainer::v1::ROUTING_REPLAY_MODE_R2);
}

TEST(ResolveJobSpecTest, SyncModeDefaultsToSyncWithStalenessZero) {
  const trainer::v1::JobSpec resolved = ResolveOk(MinimalValidSpec());
  EXPECT_EQ(resolved.sync_mode(), trainer::v1::SYNC_MODE_SYNC);
  EXPECT_EQ(resolved.max_staleness(), 0);
}

TEST(ResolveJobSpecTest, MaxStalenessDefaultsToOneInAsync) {
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.set_sync_mode(trainer::v1::SYNC_MODE_ASYNC);
  EXPECT_EQ(ResolveOk(spec).max_staleness(), 1);
  spec.set_max_staleness(4);
  EXPECT_EQ(ResolveOk(spec).max_staleness(), 4);
}

TEST(ResolveJobSpecTest, ExpertLayoutDefaultsToPerExpert) {
  EXPECT_EQ(ResolveOk(MinimalValidSpec()).lora().expert_layout(),
            type::v1::EXPERT_LAYOUT_PER_EXPERT);
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_lora()->set_expert_layout(type::v1::EXPERT_LAYOUT_SHARED_OUTER);
  EXPECT_EQ(ResolveOk(spec).lora().expert_layout(), type::v1::EXPERT_LAYOUT_SHARED_OUTER);
}

}  // namespace
}  // namespace tandem::trainer

namespace tandem::trainer {
namespace {

TEST(ResolveJobSpecTest, NanAndInfinityAreRefusedInEveryFloatField) {
  const std::vector<std::pair<std::string, std::function<void(trainer::v1::JobSpec&, double)>>>
      fields = {
          {"weight_decay", [](trainer::v1::JobSpec& s,
                              double v) { s.mutable_algorithm_config()->set_weight_decay(v); }},
          {"max_grad_norm", [](trainer::v1::JobSpec& s,
                               double v) { s.mutable_algorithm_config()->set_max_grad_norm(v); }},
          {"clip_eps_low", [](trainer::v1::JobSpec& s,
                              double v) { s.mutable_algorithm_config()->set_clip_eps_low(v); }},
          {"clip_eps_high", [](trainer::v1::JobSpec& s,
                               double v) { s.mutable_algorithm_config()->set_clip_eps_high(v); }},
          {"dual_clip_c", [](trainer::v1::JobSpec& s,
                             double v) { s.mutable_algorithm_config()->set_dual_clip_c(v); }},
          {"kl_coef",
           [](trainer::v1::JobSpec& s, double v) { s.mutable_algorithm_config()->set_kl_coef(v); }},
          {"gamma",
           [](trainer::v1::JobSpec& s, double v) { s.mutable_algorithm_config()->set_gamma(v); }},
          {"gae_lambda", [](trainer::v1::JobSpec& s,
                            double v) { s.mutable_algorithm_config()->set_gae_lambda(v); }},
          {"is_correction", [](trainer::v1::JobSpec& s,
                               double v) { s.mutable_is_correction()->set_lower_bound(v); }},
      };
  for (const auto& [field, set] : fields) {
    trainer::v1::JobSpec spec = MinimalValidSpec();
    set(spec, std::numeric_limits<double>::quiet_NaN());
    const absl::Status status = ResolveStatus(spec);
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << field << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr(field));
    EXPECT_THAT(status.message(), HasSubstr("nan"));
  }
  for (const std::string field : {"weight_decay", "kl_coef", "clip_eps_high", "dual_clip_c"}) {
    trainer::v1::JobSpec spec = MinimalValidSpec();
    for (const auto& [name, set] : fields) {
      if (name == field) set(spec, std::numeric_limits<double>::infinity());
    }
    EXPECT_TRUE(absl::IsInvalidArgument(ResolveStatus(spec))) << field;
  }
}

TEST(ResolveJobSpecTest, EnumValuesOutsideTheirEnumAreRefused) {
  const std::vector<std::pair<std::string, std::function<void(trainer::v1::JobSpec&)>>> fields = {
      {"routing_replay",
       [](trainer::v1::JobSpec& s) {
         s.set_routing_replay(static_cast<trainer::v1::RoutingReplayMode>(7));
       }},
      {"sync_mode",
       [](trainer::v1::JobSpec& s) { s.set_sync_mode(static_cast<trainer::v1::SyncMode>(7)); }},
      {"is_correction.mode",
       [](trainer::v1::JobSpec& s) {
         s.mutable_is_correction()->set_mode(static_cast<trainer::v1::IsCorrectionMode>(9));
       }},
      {"is_correction.rejection_level",
       [](trainer::v1::JobSpec& s) {
         s.mutable_is_correction()->set_rejection_level(
             static_cast<trainer::v1::RejectionLevel>(9));
       }},
      {"algorithm_config.kl_estimator",
       [](trainer::v1::JobSpec& s) {
         s.mutable_algorithm_config()->set_kl_estimator(static_cast<trainer::v1::KlEstimator>(9));
       }},
      {"algorithm_config.loss_aggregation",
       [](trainer::v1::JobSpec& s) {
         s.mutable_algorithm_config()->set_loss_aggregation(
             static_cast<trainer::v1::LossAggregation>(9));
       }},
  };
  for (const auto& [field, set] : fields) {
    trainer::v1::JobSpec spec = MinimalValidSpec();
    set(spec);
    const absl::Status status = ResolveStatus(spec);
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << field << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr("spec." + field + " is "));
    EXPECT_THAT(status.message(), HasSubstr("no value of its enum"));
  }
}

TEST(ResolveJobSpecTest, SamplingFollowsTheRolloutsRulesAtCreateTime) {
  const std::vector<std::pair<std::string, std::function<void(type::v1::SamplingParams&)>>> cases =
      {
          {"sampling.temperature is 101",
           [](type::v1::SamplingParams& p) { p.set_temperature(101); }},
          {"sampling.temperature is nan",
           [](type::v1::SamplingParams& p) { p.set_temperature(std::nanf("")); }},
          {"sampling.top_p is 0", [](type::v1::SamplingParams& p) { p.set_top_p(0); }},
          {"sampling.top_k is -1", [](type::v1::SamplingParams& p) { p.set_top_k(-1); }},
          {"sampling.stop_token_ids: -3",
           [](type::v1::SamplingParams& p) { p.add_stop_token_ids(-3); }},
          {"sampling.stop_token_ids has 65",
           [](type::v1::SamplingParams& p) {
             for (int i = 0; i < 65; ++i) p.add_stop_token_ids(2);
           }},
          // The job seeds each step's sampling from spec.seed: a seed here would be ignored.
          {"sampling.seed is 5; set spec.seed", [](type::v1::SamplingParams& p) { p.set_seed(5); }},
      };
  for (const auto& [message, set] : cases) {
    trainer::v1::JobSpec spec = MinimalValidSpec();
    set(*spec.mutable_sampling());
    const absl::Status status = ResolveStatus(spec);
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << message << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr("spec." + message));
  }
  // The vocabulary is the base model's, checked when the job starts: a Qwen3 job's top_k of 50
  // or stop token 151645 is not judged by the embedded model's 49 tokens.
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.mutable_sampling()->set_top_k(50);
  spec.mutable_sampling()->add_stop_token_ids(151645);
  EXPECT_TRUE(ResolveStatus(spec).ok()) << ResolveStatus(spec);
}

TEST(ResolveJobSpecTest, AdapterNameFollowsTheIdentifierRule) {
  for (const std::string& name :
       {std::string("has space"), std::string("../escape"), std::string(129, 'a')}) {
    trainer::v1::JobSpec spec = MinimalValidSpec();
    spec.set_adapter_name(name);
    const absl::Status status = ResolveStatus(spec);
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << name;
    EXPECT_THAT(status.message(), HasSubstr("bad spec.adapter_name"));
  }
  trainer::v1::JobSpec spec = MinimalValidSpec();
  spec.set_adapter_name("team/policy:v2");
  EXPECT_TRUE(ResolveStatus(spec).ok());
}

}  // namespace
}  // namespace tandem::trainer
